#!/usr/bin/env bash
# Downloads (without installing) the Debian packages the training corpus is made from and unpacks
# them under WORKDIR/x, then writes WORKDIR/corpus.jsonl.xz with make_corpus.py.
# Usage: tools/train/fetch_corpus.sh WORKDIR   (Debian 12 "bookworm" package versions were used)
set -euo pipefail
work=$(realpath -m "${1:?usage: fetch_corpus.sh WORKDIR}")
here=$(cd "$(dirname "$0")" && pwd)
pkgs="python3.11-doc sphinx-doc postgresql-doc-15 sqlite3-doc rust-doc python-django-doc
      dict-devil dict-jargon bible-kjv bible-kjv-text"
mkdir -p "$work/debs" "$work/x"
(cd "$work/debs" && apt-get download $pkgs)
for deb in "$work"/debs/*.deb; do
  name=$(basename "$deb"); name=${name%%_*}
  mkdir -p "$work/x/$name"
  dpkg -x "$deb" "$work/x/$name"
done
/usr/bin/python3 "$here/make_corpus.py" "$work/x" "$work/corpus.jsonl.xz"
