"""Extract and clean the demo model's public-domain training text.

    python -m diffuse.train.corpus OUT_DIR

writes OUT_DIR/austen.txt and OUT_DIR/fortunes.txt: one document (a paragraph or a fortune) per
block, blocks separated by a blank line, which is the format `diffuse train` reads.

Sources (Debian packages, installable offline from a mirror):
- r-cran-janeaustenr: Jane Austen's six novels as R character vectors (one line of the Project
  Gutenberg text each). Exported with `Rscript` (r-base-core comes with the package).
- fortunes / fortunes-min: /usr/share/games/fortunes/<name>, fortunes separated by "%" lines.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from diffuse import DiffuseError

AUSTEN_NOVELS = ["sensesensibility", "prideprejudice", "mansfieldpark", "emma", "northangerabbey", "persuasion"]
FORTUNE_DIR = Path("/usr/share/games/fortunes")
# Plain-prose collections; left out: ASCII art, crude ones, and quotations from modern novels/TV.
FORTUNE_FILES = [
    "computers", "cookie", "definitions", "education", "food", "fortunes", "goedel", "humorists",
    "kids", "law", "literature", "love", "magic", "medicine", "miscellaneous", "paradoxum", "people",
    "pets", "platitudes", "politics", "riddles", "science", "songs-poems", "sports", "tao", "wisdom", "work",
]
# One novel per record; R writes each line with its embedded newlines escaped by writeLines as-is.
_R_EXPORT = (
    "library(janeaustenr); out <- commandArgs(TRUE)[1]; "
    "for (n in c({names})) writeLines(c(paste0('### ', n), get(n)), file.path(out, paste0(n, '.txt')), useBytes = TRUE)"
)


def _clean(text: str) -> str:
    text = text.replace("_", "")  # Gutenberg's _emphasis_ marks
    text = text.replace("\u2019", "'").replace("\u2018", "'").replace("\u201c", '"').replace("\u201d", '"')
    return re.sub(r"\s+", " ", text).strip()


def _is_heading(paragraph: str) -> bool:
    # "CHAPTER I", "VOLUME II", titles: no lower-case letter at all
    return not re.search(r"[a-z]", paragraph)


def austen_paragraphs(tmp_dir: Path) -> list[str]:
    names = ", ".join(f"'{n}'" for n in AUSTEN_NOVELS)
    try:
        subprocess.run(["Rscript", "-e", _R_EXPORT.replace("{names}", names), str(tmp_dir)], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as e:
        raise DiffuseError(f"Rscript could not export janeaustenr (apt-get install r-cran-janeaustenr): {e}") from e
    paragraphs = []
    for name in AUSTEN_NOVELS:
        lines = (tmp_dir / f"{name}.txt").read_text(encoding="utf-8").splitlines()[1:]
        for block in "\n".join(lines).split("\n\n"):
            p = _clean(block)
            if p and not _is_heading(p) and not p.lower().startswith("by jane austen"):
                paragraphs.append(p)
    return paragraphs


def fortunes() -> list[str]:
    out = []
    for name in FORTUNE_FILES:
        path = FORTUNE_DIR / name
        if not path.is_file():
            continue  # fortunes-min installs only "fortunes"
        for block in path.read_text(encoding="utf-8", errors="replace").split("\n%\n"):
            f = _clean(block.strip("%\n"))
            letters = sum(c.isalpha() or c == " " for c in f)
            if 20 <= len(f) <= 600 and letters >= 0.8 * len(f):
                out.append(f)
    if not out:
        raise DiffuseError(f"{FORTUNE_DIR}: no fortunes found (apt-get install fortunes fortunes-min)")
    return out


def write_corpus(out_dir: Path) -> dict[str, int]:
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / "_austen_lines"
    tmp.mkdir(exist_ok=True)
    sources = {"austen": austen_paragraphs(tmp), "fortunes": fortunes()}
    for f in tmp.iterdir():
        f.unlink()
    tmp.rmdir()
    for name, docs in sources.items():
        (out_dir / f"{name}.txt").write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return {name: len(docs) for name, docs in sources.items()}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m diffuse.train.corpus OUT_DIR", file=sys.stderr)
        return 2
    for name, n in write_corpus(Path(argv[0])).items():
        print(f"{name}: {n} documents")
    return 0


if __name__ == "__main__":
    sys.exit(main())
