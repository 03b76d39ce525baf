"""The regime study read together: in the paper's regime (long window T/8, text 97 % of the
targets), what do the laziness map, the claims, the natural far share of text and the text-only
studies say side by side? It trains nothing: it reads the other studies' committed results
(README.md; the report: REPORT.md; the lab notes of every part: NOTES.md)."""
