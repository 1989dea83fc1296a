"""Dataset folders as `bench generate` and `bench import` write them, under one rule: a command
deletes or overwrites only what it can prove it wrote.

The proof is a manifest. While a writer runs, the folder it writes holds
`.bench-manifest.json` (what is being written, and the names of every file it will create
there) and `.bench.lock`, which the writer holds with `flock` for its whole run: a second
writer is refused in one line, and a killed one never leaves the folder locked (the kernel
drops the lock). Once the card is written, the card is the manifest (it lists the shards),
and the writer's manifest and lock are removed, so a finished dataset holds its card and
shards only. Anything in a folder that neither names is the user's: the folder is refused,
in one line, with nothing touched.

Replacing a finished dataset (`--overwrite`), and every import, builds the new one in a
staging folder beside the target, `.NAME.staging`, with its own manifest and lock, then
swaps it in whole. A staging folder whose lock nobody holds was left by a run that died
(kill -9 included): the next run resumes it when it writes the same thing, else removes
what it holds of its own. An unfinished `generate` folder of other settings (manifest `about`)
is refused without `--overwrite`, naming what differs: its shards are neither deleted
unasked nor mixed into a card that would not describe them.

Files written beside a user's own (`report`, `leaderboard --out`, `plot -o`) and a site's folder
follow the same rule through a list of their own, `.NAME.files.json` (`WrittenFiles`): a name
is overwritten only when the list holds it, and a folder output goes only into a new or empty
folder or one its list covers whole (`check_own_folder`, which a study's folder can use too).
A folder a command makes beside its output (a report's figures, `PAGE_files/`) lists its files
in `.files.json` inside it (`FolderFiles`).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import sys
from pathlib import Path
from typing import Any, Iterable, Sequence

from bench.core.dataset import CARD_NAME, Dataset, write_json_atomic
from bench.core.errors import BenchError
from bench.core.locks import same_file, try_lock
from bench.core.paths import check_output_dir

MANIFEST_NAME = ".bench-manifest.json"
LOCK_NAME = ".bench.lock"
#: The temporaries of `write_json_atomic` / `write_parquet_atomic`: `.NAME.tmp-PID`.
_TEMPORARY = re.compile(r"\.(?P<name>.+)\.tmp-\d+")


def staging_path(out: Path) -> Path:
    """Where a replacement of `out` is built: beside it, so the swap is a rename."""
    out = out.resolve()
    return out.with_name(f".{out.name}.staging")


def read_manifest(folder: Path) -> dict[str, Any] | None:
    """A folder's writer manifest, None when it has none (or one that is not ours)."""
    try:
        manifest = json.loads((folder / MANIFEST_NAME).read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, list) or not all(isinstance(f, str) and Path(f).name == f for f in files):
        return None
    return manifest


def owned_files(folder: Path) -> set[str]:
    """The names in `folder` a bench writer provably made: its manifest's files, the card and
    the shards the card lists, and the manifest and lock themselves."""
    names = {MANIFEST_NAME, LOCK_NAME}
    manifest = read_manifest(folder)
    if manifest is not None:
        names |= {*manifest["files"], CARD_NAME}
    try:
        card = json.loads((folder / CARD_NAME).read_text())
        names.add(CARD_NAME)
        names |= {s for info in card["splits"].values() for s in info["shards"]
                  if isinstance(s, str) and Path(s).name == s}
    except (OSError, UnicodeDecodeError, ValueError, TypeError, KeyError, AttributeError):
        pass
    return names


def _is_owned(entry: Path, owned: set[str]) -> bool:
    match = _TEMPORARY.fullmatch(entry.name)
    return entry.is_file() and not entry.is_symlink() and (entry.name in owned or bool(match and match["name"] in owned))


def foreign_files(folder: Path, owned: set[str] | None = None) -> list[str]:
    """Names in `folder` that no bench writer can be shown to have made, sorted. `owned`: the
    names the writer's own manifest lists (default: a dataset writer's, `owned_files`)."""
    owned = owned_files(folder) if owned is None else owned
    return sorted(e.name for e in folder.iterdir() if not _is_owned(e, owned))


def remove_owned(folder: Path, keep: Iterable[str] = ()) -> bool:
    """Delete the files of `folder` a bench writer made (but `keep`), then the folder if it is
    empty; True when the folder is gone. Nothing else is ever deleted."""
    owned = owned_files(folder)
    for entry in folder.iterdir():
        if _is_owned(entry, owned) and entry.name not in keep:
            entry.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        folder.rmdir()
        return True
    return False


def check_target(out: Path, overwrite: bool, *, sources: Sequence[Path] = (), stage: bool = False) -> None:
    """Refuse, touching nothing, a destination a dataset writer must not write: one that holds
    anything bench did not write, a dataset without `overwrite`, a damaged card, the working
    directory when it would be swapped away, or a folder that holds or lies inside a source.

    `stage`: the writer always builds beside `out` and swaps it in (an import)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise BenchError(f"out: {out} exists and is not a directory")
    where = out.resolve()
    for src in sources:
        src = Path(src).resolve()
        if where == src or where.is_relative_to(src) or src.is_relative_to(where):
            relation = "is" if where == src else "lies inside" if where.is_relative_to(src) else "holds"
            raise BenchError(f"out: {out} {relation} the source {src}; write the dataset to a folder outside it")
    swapped = stage
    if (out / CARD_NAME).exists():
        Dataset(out)  # a damaged card is not "a dataset" to replace: refuse, in one line
        if not overwrite:
            raise BenchError(f"out: {out} already holds a dataset; pass --overwrite to replace it")
        _refuse_foreign(out, "holds a dataset and other files; --overwrite replaces only what the dataset wrote")
        swapped = True
    elif out.is_dir() and any(out.iterdir()):
        if read_manifest(out) is None and {e.name for e in out.iterdir()} != {LOCK_NAME}:
            raise BenchError(f"out: {out} is not empty and not a BindingBench dataset; choose another directory "
                             "(--overwrite replaces only a dataset)")
        _refuse_foreign(out, "holds an unfinished dataset and other files; move them out or choose another directory")
    if swapped and Path.cwd().resolve().is_relative_to(where):  # the swap would leave the shell in a deleted copy
        raise BenchError(f"out: {out} is (or holds) the working directory; run from its parent with "
                         f"--out {where.name}")
    check_output_dir(out, "out")


def _refuse_foreign(folder: Path, problem: str) -> None:
    foreign = foreign_files(folder)
    if foreign:
        raise BenchError(f"out: {folder} {problem} (e.g. {foreign[0]!r}); nothing was changed")


class DatasetTarget:
    """A claimed dataset destination: `work` is where the files go (`out`, or its staging
    folder), locked against other writers until `close`.

    `key` names what is written, `about` (shown, not compared) the settings it hashes: an
    unfinished folder of the same key resumes (when `resume`); one of another key is the
    unfinished work of other settings, refused in one line naming the settings that differ
    (when `resume`, unless `overwrite`: it would be deleted, or, resumed, mixed into a card
    that describes only some of its shards), else cleared of its own files first. `record`
    lists the files about to be written (before they are); `commit`, after the card, swaps a
    staged dataset in and removes the manifests and locks. `discard` removes everything this
    writer made (a failed import leaves nothing behind)."""

    def __init__(self, out: Path, key: str, *, overwrite: bool = False, sources: Sequence[Path] = (),
                 stage: bool = False, resume: bool = True, about: dict[str, Any] | None = None) -> None:
        self.out, self.key, self.resume, self.overwrite = Path(out), key, resume, overwrite
        self.about = json.loads(json.dumps(about or {}))  # as the manifest will hold it (tuples as lists)
        self._fds: list[int] = []
        check_target(self.out, overwrite, sources=sources, stage=stage)
        self.created = not self.out.exists()
        try:
            self.out.mkdir(parents=True, exist_ok=True)
            self._lock(self.out)
            check_target(self.out, overwrite, sources=sources, stage=stage)  # again, now that no writer can race us
            self.work = staging_path(self.out) if stage or (self.out / CARD_NAME).exists() else self.out
            if self.work != self.out:
                self.work.mkdir(exist_ok=True)
                self._lock(self.work)
            self._claim()
        except OSError as e:
            self._abandon()
            raise BenchError(f"out: cannot write {e.filename or out} ({e.strerror}); choose a writable "
                             "directory") from None
        except BaseException:
            self._abandon()
            raise

    def _abandon(self) -> None:
        """A claim that failed: unlock, and remove `out` again if this writer made it (and
        holds its lock, so no other writer is using it)."""
        if self.created and self._fds:
            remove_owned(self.out)
        self.close()

    def _lock(self, folder: Path) -> None:
        while True:
            fd = try_lock(folder / LOCK_NAME, create=True)
            if fd is None:
                raise BenchError(f"out: {self.out} is being written by another bench command; wait for it to "
                                 "finish or choose another directory")
            if same_file(fd, folder / LOCK_NAME):
                self._fds.append(fd)
                return
            os.close(fd)  # removed by the writer we raced: lock the new one

    def _claim(self) -> None:
        """Make `work` this writer's: an unfinished run of the same key resumes (when `resume`),
        less its killed writers' temporaries; otherwise its own files are cleared and a new
        manifest written."""
        manifest = read_manifest(self.work)
        if self.resume and manifest is not None and manifest.get("key") == self.key:
            owned = owned_files(self.work)
            for tmp in self.work.iterdir():  # we hold the lock: no temporary here is being written
                if tmp.name not in owned and _is_owned(tmp, owned):
                    tmp.unlink()
            return
        if self.resume and not self.overwrite and manifest is not None and any(
                (self.work / name).exists() for name in manifest["files"]):
            raise BenchError(f"out: {self.work} holds an unfinished dataset of other settings "
                             f"({_differences(manifest.get('about'), self.about)}); run its own command to finish "
                             "it, or pass --overwrite to start afresh")
        foreign = foreign_files(self.work)
        if foreign:  # only a staging folder can get here with files of someone else's
            raise BenchError(f"out: {self.work} holds files bench did not write (e.g. {foreign[0]!r}); move them "
                             "out")
        remove_owned(self.work, keep=(LOCK_NAME,))
        write_json_atomic({"key": self.key, "about": self.about, "files": []}, self.work / MANIFEST_NAME)

    @property
    def manifest(self) -> Path:
        return self.work / MANIFEST_NAME

    def record(self, files: Sequence[str]) -> None:
        """Name, before they are written, the files this writer will create in `work`."""
        write_json_atomic({"key": self.key, "about": self.about, "files": sorted(set(files))}, self.manifest)

    def commit(self) -> None:
        """The card is written: swap a staged dataset in, and remove manifests and locks."""
        if self.work != self.out:
            _swap(self.work, self.out)  # the old dataset (or our empty claim) now sits at `work`
            remove_owned(self.work)
            self.work = self.out
        for name in (MANIFEST_NAME, LOCK_NAME):
            (self.out / name).unlink(missing_ok=True)
        self.close()

    def discard(self) -> None:
        """Remove every file this writer made, and the folders it created."""
        if self.work != self.out:
            remove_owned(self.work)
        if self.created:
            remove_owned(self.out)
        else:
            for name in (MANIFEST_NAME, LOCK_NAME):
                (self.out / name).unlink(missing_ok=True)
        self.close()

    def close(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()


class WrittenFiles:
    """The files a command writes beside `main` (itself included), listed in `.MAIN.files.json`:
    the proof that they are bench's, for commands that write into a folder the user may share
    (`report`'s page, `leaderboard --out`, `plot -o`) or that is theirs alone (a site).

    `check` refuses, touching nothing, a name to be written that holds anything the list does
    not (a user's file, a link, a folder); `claim` checks too, then adds the names to the list
    before they are written, so a run killed half-way leaves no file unlisted; `finish` records
    what this run wrote and removes what the list held, this run did not write and starts with
    `prefix` (a figure no longer drawn). A damaged list proves nothing: every existing name is
    then refused."""

    def __init__(self, main: str | os.PathLike, what: str) -> None:
        self.main, self.what = Path(main), what
        if self.main.is_dir() or not self.main.name or self.main.name in (".", ".."):
            raise BenchError(f"{what}: {self.main} is a directory; name a file inside it")
        self._read(self.main.parent / f".{self.main.name}.files.json")

    def _read(self, manifest: Path) -> None:
        """Load the list at `manifest`, which names the files beside it."""
        self.folder, self.manifest = manifest.parent, manifest
        self.damaged = False
        try:
            listed = json.loads(self.manifest.read_text())["files"]
            if not isinstance(listed, list):
                raise TypeError
        except FileNotFoundError:
            listed = []
        except (OSError, UnicodeDecodeError, ValueError, TypeError, KeyError):
            listed, self.damaged = [], True
        self.listed = {n for n in listed if isinstance(n, str) and Path(n).name == n and n not in (".", "..")}

    def check(self, paths: Iterable[str | os.PathLike]) -> list[Path]:
        """The paths, each in this folder; BenchError when one holds anything bench cannot show it wrote."""
        out = []
        for p in map(Path, paths):
            if p.parent != self.folder:
                raise ValueError(f"{p} is not in {self.folder}")  # a caller's bug, not the user's input
            if p.is_symlink() or (p.exists() and not p.is_file()):
                kind = "a link" if p.is_symlink() else "a directory"
                raise BenchError(f"{self.what}: {p} is {kind}; bench writes only files it made there, so choose "
                                 "another name (nothing was changed)")
            if p.exists() and p.name not in self.listed:
                why = f"{self.manifest.name} is damaged" if self.damaged else f"{self.manifest.name} does not list it"
                raise BenchError(f"{self.what}: {p} exists and bench did not write it ({why}); move it or choose "
                                 "another name (nothing was changed)")
            out.append(p)
        return out

    def claim(self, paths: Iterable[str | os.PathLike]) -> None:
        """`check` the paths, then list them before they are written."""
        names = {p.name for p in self.check(paths)}
        if names - self.listed:
            self.listed |= names
            self.folder.mkdir(parents=True, exist_ok=True)
            write_json_atomic({"files": sorted(self.listed)}, self.manifest)

    def finish(self, written: Sequence[str | os.PathLike], prefix: str | None = None) -> list[Path]:
        """List what this run wrote, and remove (when `prefix` is given) the listed files starting
        with it that this run did not write; returns what was removed. A listed file kept stays
        listed: it is still bench's."""
        now = {Path(p).name for p in written}
        removed, kept = [], set()
        for name in sorted(self.listed - now):
            path = self.folder / name
            if not path.is_file() or path.is_symlink():
                continue
            if prefix is not None and name.startswith(prefix):
                path.unlink()
                removed.append(path)
            else:
                kept.add(name)
        self.listed = now | kept
        write_json_atomic({"files": sorted(self.listed)}, self.manifest)
        return removed

    def check_folder(self, kind: str) -> None:
        """For a writer that owns the whole folder (a site): `check_own_folder` with this list."""
        if self.damaged and self.folder.is_dir():
            raise BenchError(f"{self.what}: {self.manifest} is damaged, so nothing in {self.folder} can be shown "
                             f"to be a {kind} bench wrote; choose another folder (nothing was changed)")
        check_own_folder(self.folder, self.listed | {self.manifest.name} if self.manifest.exists() else None,
                         self.what, kind)


class FolderFiles(WrittenFiles):
    """The files of a folder a command makes beside its main output and fills alone, with no main
    file of its own: a report's figures in `PAGE_files/`, as a browser saves a page. Its list is
    `FOLDER/.files.json`. `check_folder` refuses, touching nothing, a folder that is not new,
    empty or wholly listed, and a link in its place (the command names this folder itself, so
    a link there was not made by it); `finish` also removes the folder once nothing of its own
    is left in it."""

    def __init__(self, folder: str | os.PathLike, what: str) -> None:
        self.main, self.what = Path(folder), what
        self._read(self.main / ".files.json")

    def check_folder(self, kind: str) -> None:
        if self.folder.is_symlink():
            raise BenchError(f"{self.what}: {self.folder} is a link; the {kind} writes only into a folder it makes "
                             "there, so move the link or choose another name (nothing was changed)")
        super().check_folder(kind)

    def finish(self, written: Sequence[str | os.PathLike], prefix: str | None = None) -> list[Path]:
        if not written and not self.manifest.is_file():
            return []  # nothing written now or listed before: no folder of its own to keep or to clear
        removed = super().finish(written, prefix)
        if not self.listed:
            self.manifest.unlink()
            with contextlib.suppress(OSError):  # a user's file added since stays, and so does the folder
                self.folder.rmdir()
        return removed


def check_own_folder(folder: str | os.PathLike, owned: set[str] | None, what: str, kind: str) -> None:
    """Refuse, touching nothing, a folder output (`kind`: a site, a study) that is neither new,
    nor empty, nor wholly the writer's own. `owned`: the names the folder's manifest proves the
    writer made (None: it has no manifest). Anything else in it (a user's page, a link, a sub-folder)
    is the user's, so the folder is refused: the working directory with files in it, all alike, by
    what they hold. A link is refused whatever it points to: what it names is another folder, whose
    owner the link does not say."""
    folder = Path(folder)
    if folder.is_symlink():
        raise BenchError(f"{what}: {folder} is a link; name the folder itself (a {kind} is never written through a "
                         "link; nothing was changed)")
    if folder.exists() and not folder.is_dir():
        raise BenchError(f"{what}: {folder} exists and is not a directory")
    if folder.is_dir():
        entries = sorted(e.name for e in folder.iterdir())
        if entries and owned is None:
            raise BenchError(f"{what}: {folder} is not empty and holds no {kind} bench wrote (e.g. {entries[0]!r}); "
                             "choose a new or empty folder (nothing was changed)")
        foreign = foreign_files(folder, owned) if entries else []
        if foreign:
            raise BenchError(f"{what}: {folder} holds files the {kind} did not write (e.g. {foreign[0]!r}); move "
                             "them out or choose another folder (nothing was changed)")
    check_output_dir(folder, what)


def _differences(old: Any, new: dict[str, Any]) -> str:
    """What differs between an unfinished run's settings and these, as `seed 1, here 2`."""
    if not isinstance(old, dict):
        return "written before its settings were recorded"
    keys = [k for k in sorted({*old, *new}) if old.get(k) != new.get(k)]
    return "; ".join(f"{k} {old.get(k)!r}, here {new.get(k)!r}" for k in keys) or "same settings, another version"


def _swap(new: Path, out: Path) -> None:
    """Put the folder `new` at `out` and the old `out` at `new`, so either name always holds
    a whole folder. Linux swaps them in one step (renameat2 RENAME_EXCHANGE); elsewhere the
    old one is renamed aside first."""
    out = out.resolve()
    if _exchange(new, out):
        return
    aside = out.with_name(f".{out.name}.old-{os.getpid()}")
    os.replace(out, aside)
    os.replace(new, out)
    os.replace(aside, new)


def _exchange(a: Path, b: Path) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        return False
    at_fdcwd, rename_exchange = -100, 2
    return renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0
