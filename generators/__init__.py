"""Scene distributions, renderers and exact priors; they write dataset directories."""
