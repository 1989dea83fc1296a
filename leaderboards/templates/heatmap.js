"use strict";
const DATA = JSON.parse(document.getElementById("bench-data").textContent);
const CMAP = DATA.colormap;
const PARAMS = new URLSearchParams(window.location.search);

function decodeScores(b64) {
  const raw = atob(b64);
  const out = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i++) out[i] = raw.charCodeAt(i);
  return out;
}

function loadImage(b64) {
  return new Promise((resolve, reject) => {
    const img = new Image();
    img.onload = () => resolve(img);
    img.onerror = () => reject(new Error("scene image failed to decode"));
    img.src = "data:image/png;base64," + b64;
  });
}

function el(tag, attrs, text) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

class Heatmap {
  constructor(root, analysis) {
    this.a = analysis;
    this.rows = analysis.grid[0];
    this.cols = analysis.grid[1];
    this.scene = 0;
    this.layer = analysis.layers.length - 1;
    this.selected = null;
    this.cache = new Map();
    this.canvas = el("canvas", {width: 448, height: 448});
    const controls = el("div", {class: "controls"});
    this.sceneSelect = el("select");
    analysis.scenes.forEach((s, i) => this.sceneSelect.appendChild(el("option", {value: i}, s.id)));
    this.slider = el("input", {type: "range", min: 0, max: analysis.layers.length - 1, value: this.layer, step: 1});
    this.layerText = el("span");
    this.info = el("p", {}, "Click a patch of the scene.");
    const legend = el("canvas", {class: "legend", width: 256, height: 12});
    const lctx = legend.getContext("2d");
    for (let i = 0; i < 256; i++) { lctx.fillStyle = `rgb(${CMAP[i].join(",")})`; lctx.fillRect(i, 0, 1, 12); }
    const sceneLabel = el("label", {}, "scene ");
    sceneLabel.appendChild(this.sceneSelect);
    const layerLabel = el("label", {}, "layer ");
    layerLabel.appendChild(this.layerText);
    layerLabel.appendChild(el("br"));
    layerLabel.appendChild(this.slider);
    controls.append(el("strong", {}, analysis.title), sceneLabel, layerLabel,
                    el("div", {}, "P(same object): 0 → 1"), legend, this.info);
    root.append(this.canvas, controls);
    this.canvas.addEventListener("click", (ev) => {
      const r = this.canvas.getBoundingClientRect();
      this.select((ev.clientX - r.left) / r.width, (ev.clientY - r.top) / r.height);
    });
    this.slider.addEventListener("input", () => { this.layer = Number(this.slider.value); this.draw(); });
    this.sceneSelect.addEventListener("change", () => this.setScene(Number(this.sceneSelect.value)));
  }

  async setScene(i) {
    this.scene = i;
    this.selected = null;
    this.image = await loadImage(this.a.scenes[i].image);
    this.draw();
  }

  select(fx, fy) {
    const r = Math.min(this.rows - 1, Math.max(0, Math.floor(fy * this.rows)));
    const c = Math.min(this.cols - 1, Math.max(0, Math.floor(fx * this.cols)));
    this.selected = r * this.cols + c;
    this.draw();
  }

  scores() {
    const key = `${this.scene}/${this.layer}`;
    if (!this.cache.has(key)) {
      const layer = String(this.a.layers[this.layer]);
      this.cache.set(key, decodeScores(this.a.scenes[this.scene].scores[layer]));
    }
    return this.cache.get(key);
  }

  draw() {
    const ctx = this.canvas.getContext("2d");
    const w = this.canvas.width, h = this.canvas.height;
    const pw = w / this.cols, ph = h / this.rows;
    this.layerText.textContent = `${this.a.layers[this.layer]} (${this.layer + 1} of ${this.a.layers.length})`;
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(this.image, 0, 0, w, h);
    if (this.selected === null) { this.canvas.dataset.selected = ""; return; }
    const t = this.rows * this.cols;
    const s = this.scores();
    const labels = this.a.scenes[this.scene].labels;
    ctx.globalAlpha = 0.6;
    for (let k = 0; k < t; k++) {
      const v = s[this.selected * t + k];
      ctx.fillStyle = `rgb(${CMAP[v].join(",")})`;
      ctx.fillRect((k % this.cols) * pw, Math.floor(k / this.cols) * ph, Math.ceil(pw), Math.ceil(ph));
    }
    ctx.globalAlpha = 1;
    ctx.strokeStyle = "#ff2d2d";
    ctx.lineWidth = 3;
    ctx.strokeRect((this.selected % this.cols) * pw, Math.floor(this.selected / this.cols) * ph, pw, ph);
    const label = labels[this.selected];
    this.canvas.dataset.selected = String(this.selected);
    this.info.textContent = `patch ${Math.floor(this.selected / this.cols)},${this.selected % this.cols} ` +
      `(label ${label < 0 ? "ignored" : label === 0 ? "background" : label})`;
  }
}

async function main() {
  const views = [];
  for (const root of document.querySelectorAll(".heatmap")) {
    const a = DATA.analyses[Number(root.dataset.analysis)];
    if (!a.scenes.length) { root.textContent = "No scenes stored in this analysis."; continue; }
    const view = new Heatmap(root, a);
    await view.setScene(0);
    views.push(view);
  }
  if (views.length && PARAMS.has("layer")) {
    const v = views[0];
    v.layer = Math.min(v.a.layers.length - 1, Math.max(0, Number(PARAMS.get("layer"))));
    v.slider.value = v.layer;
    v.draw();
  }
  if (views.length && PARAMS.has("autoclick")) {
    const [fx, fy] = PARAMS.get("autoclick").split(",").map(Number);
    views[0].select(fx, fy);
  }
  if (PARAMS.has("measure")) {
    if (document.readyState === "complete") measure(); else window.addEventListener("load", measure);
  }
  document.body.dataset.ready = "1";
}

// ?measure: what a reader's window shows, written into the page for a headless browser's --dump-dom
function measure() {
  const px = (e) => parseFloat(getComputedStyle(e).fontSize);
  const text = [...document.querySelectorAll("p, td, th, li, label, h1, h2, h3")].filter((e) => e.textContent.trim());
  const out = {
    innerWidth: window.innerWidth,
    scrollWidth: document.documentElement.scrollWidth,
    bodyFontPx: px(document.body),
    minTextPx: Math.min(...text.map(px)),
    images: [...document.images].map((i) => ({rendered: i.getBoundingClientRect().width, natural: i.naturalWidth})),
  };
  const pre = el("pre", {id: "measure"}, JSON.stringify(out));
  document.body.appendChild(pre);
}
main().catch((e) => { console.error(e); });
