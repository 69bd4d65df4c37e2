"""Build a real-text BPE token corpus fully offline, for stoker's benchmarks.

Text comes only from files already on a Debian machine:

* man pages under ``/usr/share/man`` (gzip'ed troff, roughly stripped to plain text;
  English and translated pages; the ~16k near-identical generated ``gcloud*`` pages are
  subsampled 1 in ``GCLOUD_KEEP_EVERY`` so they do not dominate),
* text docs under ``/usr/share/doc`` (README*, changelog*, NEWS*, copyright, *.txt, *.md,
  *.rst, ... , gzip'ed or not; binaries, HTML, PDF, JSON are skipped),
* docstrings and comments of the Python standard library sources (tests excluded).

Documents are de-duplicated by exact content and capped at ``MAX_DOC_CHARS`` characters.
A byte-level BPE tokenizer (vocab 32000 including ``<|endoftext|>``) is trained on all of
it, every document is encoded and followed by the EOS id, and the flat stream is written
to ``benchmarks/.work/tokens.u16`` (raw little-endian uint16) with ``doc_lens.npy``
(tokens per document, EOS included), ``doc_source.npy`` (uint8 source code per document),
``tokenizer.json`` and ``meta.json``.  Everything is deterministic (sorted file lists).

Usage::

    python benchmarks/corpus.py [--min-mb 40] [--force]
"""

from __future__ import annotations

import argparse
import ast
import gzip
import io
import json
import os
import re
import sys
import sysconfig
import time
import tokenize
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import xxhash

WORK_DIR = Path(__file__).resolve().parent / ".work"
VOCAB_SIZE = 32000
EOS = "<|endoftext|>"
MAX_DOC_CHARS = 256_000
MIN_DOC_CHARS = 200
GCLOUD_KEEP_EVERY = 10
MAN_ROOT = Path("/usr/share/man")
DOC_ROOT = Path("/usr/share/doc")
SOURCES = ("man", "man-l10n", "doc", "pystdlib")  # index == doc_source code

# ---------------------------------------------------------------------------------------
# troff -> text
# ---------------------------------------------------------------------------------------

_NAMED = {
    "em": "\u2014",
    "en": "\u2013",
    "hy": "-",
    "bu": "\u2022",
    "aq": "'",
    "dq": '"',
    "lq": "\u201c",
    "rq": "\u201d",
    "oq": "\u2018",
    "cq": "\u2019",
    "co": "\u00a9",
    "rg": "\u00ae",
    "tm": "\u2122",
    "de": "\u00b0",
    "mu": "\u00d7",
    "+-": "\u00b1",
    "<=": "\u2264",
    ">=": "\u2265",
    "!=": "\u2260",
    "->": "\u2192",
    "<-": "\u2190",
    "ga": "`",
    "ti": "~",
    "ha": "^",
    "rs": "\\",
    "ba": "|",
    "or": "|",
    "sl": "/",
    "pl": "+",
    "mi": "-",
    "eq": "=",
    "lh": "<",
    "rh": ">",
    "Fo": "\u00ab",
    "Fc": "\u00bb",
}
# mdoc/man macros whose arguments are running text; anything else starting with "." is
# layout and is dropped.
_TEXT_MACROS = {
    "SH", "SS", "B", "I", "BR", "IR", "RB", "RI", "BI", "IB", "SM", "SB", "TP", "IP", "HP",
    "UR", "MT", "OP", "SY", "Nm", "Nd", "Fl", "Ar", "Op", "Pa", "Xr", "Sh", "Ss", "Dq", "Sq",
    "Ql", "Qq", "Em", "Sy", "Li", "Cm", "Ic", "Va", "Ev", "Fn", "Fa", "Ft", "Fd", "Dv", "Er",
    "It", "Pp", "Ad", "An", "Lk", "Mt", "Tn", "Ux", "St", "Bx", "Ox", "Nx", "Fx",
    "Aq", "Bq", "Pq", "Ms", "Ta", "Xo", "Xc", "Oo", "Oc", "Do", "Dc", "Po", "Pc", "Qo",
    "Qc", "So", "Sc", "Bo", "Bc", "Eo", "Ec", "No", "Ns", "Sx", "Vt", "Cd", "In", "Lb",
    "Rs", "%A", "%T", "%B", "%J", "%D", "%N", "%O", "%P", "%V", "IX", "UE", "ME",
}  # fmt: skip
_BREAK_MACROS = {"PP", "LP", "P", "sp", "SH", "SS", "TP", "IP", "HP", "Pp", "Sh", "Ss", "It"}
_MDOC_WORD = re.compile(r"^(?:[A-Z][a-z]{1,2}|%[A-Z])$")

_ESC_FONT = re.compile(r"\\f(?:\[[^\]]*\]|\([A-Za-z0-9]{2}|[A-Za-z0-9])")
_ESC_SIZE = re.compile(r"\\s(?:[+-]?\d+|\[[^\]]*\]|\([+-]?\d\d)")
_ESC_STR = re.compile(r"\\\*(?:\[[^\]]*\]|\(..|.)")
_ESC_NAMED = re.compile(r"\\(?:\(([^\s]{2})|\[([^\]\s]{1,20})\])")
_ESC_NUM = re.compile(r"\\[nwhvkHSoxXDlLbNYZRzg](?:'[^']*'|\[[^\]]*\]|\(..|.)?")
_ESC_SIMPLE = re.compile(r"\\[&|^%:cdupt{}!acr)]")
_ARGS = re.compile(r'"((?:[^"]|"")*)"|(\S+)')


def _unescape(s: str) -> str:
    s = s.replace("\\\\", "\x00")  # literal backslash
    s = _ESC_FONT.sub("", s)
    s = _ESC_SIZE.sub("", s)
    s = _ESC_STR.sub("", s)

    def named(m: re.Match[str]) -> str:
        key = m.group(1) or m.group(2) or ""
        if key in _NAMED:
            return _NAMED[key]
        if key.startswith("u") and len(key) in (5, 6):
            try:
                return chr(int(key[1:], 16))
            except ValueError:
                return ""
        return ""

    s = _ESC_NAMED.sub(named, s)
    s = _ESC_NUM.sub("", s)
    s = s.replace("\\-", "-").replace("\\e", "\\").replace("\\ ", " ").replace("\\~", " ")
    s = s.replace("\\0", " ").replace("\\(", "(").replace("\\.", ".").replace("\\'", "'")
    s = s.replace("\\`", "`")
    s = _ESC_SIMPLE.sub("", s)
    s = s.replace("\x00", "\\")
    return s


def troff_to_text(src: str) -> str:
    """Very rough troff (man/mdoc) to plain-text conversion."""
    out: list[str] = []
    skip_until: str | None = None
    brace_depth = 0
    for raw in src.splitlines():
        line = raw
        if skip_until is not None:
            if line.strip().startswith(skip_until):
                skip_until = None
            continue
        if brace_depth:
            brace_depth += line.count("\\{") - line.count("\\}")
            brace_depth = max(brace_depth, 0)
            continue
        # comments
        if line.startswith(('.\\"', "'\\\"", '\\"', ".\\#")):
            continue
        cut = line.find('\\"')
        if cut >= 0 and not line[:cut].endswith("\\"):
            line = line[:cut]
        if line.startswith((".", "'")) and len(line) > 1:
            body = line[1:].lstrip()
            if not body:
                continue
            name, _, rest = body.partition(" ")
            name = name.strip()
            if name in ("de", "de1", "am", "ig"):
                skip_until = ".."
                continue
            if name in ("if", "ie", "el", "while", "nr", "ds", "as", "rr", "rm", "tr"):
                opened = body.count("\\{") - body.count("\\}")
                if opened > 0:
                    brace_depth = opened
                continue
            if name in _BREAK_MACROS:
                out.append("")
            if name in _TEXT_MACROS:
                words = []
                for m in _ARGS.finditer(rest):
                    w = m.group(1) if m.group(1) is not None else m.group(2)
                    w = w.replace('""', '"')
                    if _MDOC_WORD.match(w) and w in _TEXT_MACROS:
                        continue
                    words.append(w)
                if (
                    name in ("TP", "IP", "HP")
                    and words
                    and re.fullmatch(r"[\d.]+[mni]?", words[-1])
                ):
                    words = words[:-1]
                joiner = "" if name in ("BR", "IR", "RB", "RI", "BI", "IB") else " "
                text = joiner.join(words).strip()
                if text:
                    out.append(_unescape(text))
            continue
        text = _unescape(line).rstrip()
        out.append(text)
    text = "\n".join(out)
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip() + "\n"


# ---------------------------------------------------------------------------------------
# sources
# ---------------------------------------------------------------------------------------


def _read_text(path: Path) -> str | None:
    try:
        data = path.read_bytes()
        if path.name.endswith(".gz"):
            data = gzip.decompress(data)
    except (OSError, EOFError, gzip.BadGzipFile):
        return None
    if b"\x00" in data[:65536]:
        return None
    text = data.decode("utf-8", errors="replace")
    if text.count("\ufffd") > max(8, len(text) // 200):
        text = data.decode("latin-1")
    return text


def _sorted_files(root: Path) -> list[Path]:
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for fn in sorted(filenames):
            p = Path(dirpath, fn)
            if not p.is_symlink() and p.is_file():
                files.append(p)
    return files


def man_files() -> list[tuple[int, Path]]:
    out = []
    gcloud_seen = 0
    if not MAN_ROOT.is_dir():
        return out
    for p in _sorted_files(MAN_ROOT):
        rel = p.relative_to(MAN_ROOT)
        if not p.name.endswith(".gz"):
            continue
        if p.name.startswith("gcloud"):
            gcloud_seen += 1
            if gcloud_seen % GCLOUD_KEEP_EVERY != 1:
                continue
        code = 0 if rel.parts[0].startswith("man") else 1
        out.append((code, p))
    return out


_DOC_PREFIXES = (
    "readme", "changelog", "changes", "news", "authors", "thanks", "todo", "faq", "history",
    "copyright", "credits", "bugs", "notes", "release", "install", "hacking", "contributing",
)  # fmt: skip
_DOC_EXTS = {"txt", "md", "rst", "text", "markdown", "debian", "adoc", "org", "pod"}
_DOC_BAD_EXTS = {
    "html", "htm", "json", "pdf", "ps", "tar", "png", "gif", "svg", "jpg", "css", "js",
    "xml", "c", "h", "py", "pl", "pm", "sh", "awk", "pem", "cocci", "socket", "conf", "log",
    "amd64", "cfg", "in", "mk", "el", "tgz", "zip", "bz2", "xz",
}  # fmt: skip


def doc_files() -> list[tuple[int, Path]]:
    out = []
    if not DOC_ROOT.is_dir():
        return out
    for p in _sorted_files(DOC_ROOT):
        base = p.name[:-3] if p.name.endswith(".gz") else p.name
        low = base.lower()
        ext = low.rsplit(".", 1)[1] if "." in low else ""
        if ext in _DOC_BAD_EXTS:
            continue
        if low.startswith(_DOC_PREFIXES) or ext in _DOC_EXTS:
            out.append((2, p))
    return out


def _stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


_PY_SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}


def py_files() -> list[tuple[int, Path]]:
    root = _stdlib_root()
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(
            d for d in dirnames if d not in _PY_SKIP_DIRS and not d.startswith("config-")
        )
        for fn in sorted(filenames):
            if fn.endswith(".py"):
                out.append((3, Path(dirpath, fn)))
    return out


def python_doc_text(path: Path) -> str | None:
    """Docstrings and comments of one Python source file, in source order."""
    try:
        src = path.read_text("utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    pieces: list[tuple[int, str]] = []
    try:
        tree = ast.parse(src)
    except (SyntaxError, ValueError):
        tree = None
    if tree is not None:
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc:
                    line = 0 if isinstance(node, ast.Module) else node.lineno
                    pieces.append((line, doc))
    try:
        block: list[str] = []
        start = 0
        last = -2
        for tok in tokenize.generate_tokens(io.StringIO(src).readline):
            if tok.type != tokenize.COMMENT:
                continue
            text = tok.string.lstrip("#").strip()
            if text.startswith("!") or text.startswith("-*-"):
                continue
            row = tok.start[0]
            if row != last + 1 and block:
                pieces.append((start, " ".join(block)))
                block = []
            if not block:
                start = row
            if text:
                block.append(text)
            last = row
        if block:
            pieces.append((start, " ".join(block)))
    except (tokenize.TokenError, SyntaxError):
        pass
    pieces.sort(key=lambda t: t[0])
    text = "\n\n".join(p for _, p in pieces if p.strip())
    return text + "\n" if text else None


def all_files() -> list[tuple[int, Path]]:
    return man_files() + doc_files() + py_files()


def _load(item: tuple[int, Path]) -> tuple[int, str | None]:
    code, path = item
    if code == 3:
        text = python_doc_text(path)
    else:
        text = _read_text(path)
        if text is not None and code in (0, 1):
            if len(text) < 200 and text.lstrip().startswith(".so "):
                return code, None
            text = troff_to_text(text)
    if text is None:
        return code, None
    text = text.replace("\r\n", "\n").replace(EOS, "")
    if len(text) > MAX_DOC_CHARS:
        cut = text.rfind("\n", 0, MAX_DOC_CHARS)
        text = text[: cut if cut > MAX_DOC_CHARS // 2 else MAX_DOC_CHARS]
    if len(text.strip()) < MIN_DOC_CHARS:
        return code, None
    return code, text


def iter_documents(workers: int | None = None) -> Iterator[tuple[int, str]]:
    """Yield ``(source_code, text)`` for every de-duplicated document, deterministically."""
    items = all_files()
    seen: set[int] = set()
    workers = workers or min(4, os.cpu_count() or 1)
    with ProcessPoolExecutor(workers) as ex:
        for code, text in ex.map(_load, items, chunksize=64):
            if text is None:
                continue
            h = xxhash.xxh64_intdigest(text.encode("utf-8", "surrogatepass"))
            if h in seen:
                continue
            seen.add(h)
            yield code, text


def iter_texts() -> Iterator[str]:
    """Yield the corpus documents' plain text, in corpus order (same as tokens.u16)."""
    for _, text in iter_documents():
        yield text


# ---------------------------------------------------------------------------------------
# build
# ---------------------------------------------------------------------------------------


def _train_tokenizer(texts: list[str]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return tok


def build(work_dir: Path = WORK_DIR, min_mb: float = 30.0) -> Path:
    t0 = time.perf_counter()
    work_dir.mkdir(parents=True, exist_ok=True)
    (work_dir / "tokens.u16").unlink(missing_ok=True)  # its presence marks a complete build
    texts: list[str] = []
    codes: list[int] = []
    for code, text in iter_documents():
        texts.append(text)
        codes.append(code)
    t_extract = time.perf_counter() - t0
    nbytes = [len(t.encode("utf-8", "surrogatepass")) for t in texts]
    total_mb = sum(nbytes) / 1e6
    per_source = {
        SOURCES[c]: {
            "docs": sum(1 for x in codes if x == c),
            "text_mb": round(sum(b for b, x in zip(nbytes, codes) if x == c) / 1e6, 2),
        }
        for c in range(len(SOURCES))
    }
    print(f"extracted {len(texts)} docs, {total_mb:.1f} MB of text in {t_extract:.1f}s")
    for k, v in per_source.items():
        print(f"  {k:9s} {v['docs']:6d} docs {v['text_mb']:8.2f} MB")
    if total_mb < min_mb:
        print(f"warning: only {total_mb:.1f} MB of text (< {min_mb} MB requested)", file=sys.stderr)

    t1 = time.perf_counter()
    tok = _train_tokenizer(texts)
    t_train = time.perf_counter() - t1
    tok.save(str(work_dir / "tokenizer.json"))
    eos_id = tok.token_to_id(EOS)
    vocab = tok.get_vocab_size()
    assert vocab <= 65535
    print(f"trained byte-level BPE, vocab {vocab}, eos id {eos_id}, in {t_train:.1f}s")

    t2 = time.perf_counter()
    lens = np.empty(len(texts), dtype=np.int64)
    tmp = work_dir / "tokens.u16.tmp"
    with open(tmp, "wb") as f:
        batch = 512
        for i in range(0, len(texts), batch):
            encs = tok.encode_batch(texts[i : i + batch], add_special_tokens=False)
            parts = []
            for j, e in enumerate(encs):
                ids = np.asarray(e.ids, dtype=np.uint16)
                parts.append(ids)
                parts.append(np.array([eos_id], dtype=np.uint16))
                lens[i + j] = len(ids) + 1
            f.write(np.concatenate(parts).astype("<u2").tobytes())
    t_encode = time.perf_counter() - t2
    n_tokens = int(lens.sum())
    np.save(work_dir / "doc_lens.npy", lens)
    np.save(work_dir / "doc_source.npy", np.asarray(codes, dtype=np.uint8))
    meta = {
        "sources": list(SOURCES),
        "per_source": per_source,
        "docs": len(texts),
        "text_mb": round(total_mb, 2),
        "tokens": n_tokens,
        "vocab_size": vocab,
        "eos_id": eos_id,
        "bytes_per_token": round(sum(nbytes) / n_tokens, 3),
        "gcloud_keep_every": GCLOUD_KEEP_EVERY,
        "max_doc_chars": MAX_DOC_CHARS,
        "stdlib": str(_stdlib_root()),
        "seconds": {
            "extract": round(t_extract, 1),
            "train": round(t_train, 1),
            "encode": round(t_encode, 1),
            "total": round(time.perf_counter() - t0, 1),
        },
    }
    (work_dir / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    os.replace(tmp, work_dir / "tokens.u16")  # last: its presence marks a complete build
    print(
        f"encoded {n_tokens:,} tokens ({n_tokens * 2 / 1e6:.1f} MB uint16, "
        f"{meta['bytes_per_token']} text bytes/token) in {t_encode:.1f}s; "
        f"total {meta['seconds']['total']}s -> {work_dir}"
    )
    return work_dir


def ensure_corpus(min_mb: float = 30.0, work_dir: Path = WORK_DIR, force: bool = False) -> Path:
    """Return the work dir holding tokens.u16 etc., building the corpus only if missing."""
    needed = ["tokens.u16", "doc_lens.npy", "doc_source.npy", "tokenizer.json", "meta.json"]
    if force or not all((work_dir / n).exists() for n in needed):
        build(work_dir, min_mb=min_mb)
    return work_dir


def load_tokens(work_dir: Path = WORK_DIR) -> tuple[np.ndarray, np.ndarray, dict]:
    """Memory-map the token stream; return (tokens uint16, doc_lens int64, meta)."""
    tokens = np.memmap(work_dir / "tokens.u16", dtype="<u2", mode="r")
    lens = np.load(work_dir / "doc_lens.npy")
    meta = json.loads((work_dir / "meta.json").read_text())
    return tokens, lens, meta


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--min-mb", type=float, default=30.0, help="warn below this much text")
    ap.add_argument("--force", action="store_true", help="rebuild even if cached")
    ap.add_argument("--work-dir", type=Path, default=WORK_DIR)
    args = ap.parse_args(argv)
    ensure_corpus(args.min_mb, args.work_dir, force=args.force)
    meta = json.loads((args.work_dir / "meta.json").read_text())
    print(json.dumps({k: meta[k] for k in ("docs", "text_mb", "tokens", "vocab_size")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
