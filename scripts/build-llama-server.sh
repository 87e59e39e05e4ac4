#!/usr/bin/env bash
# Builds llama.cpp's own llama-server once, as the benchmark's baseline, from
# the llama.cpp tree vendored in the llama-cpp-python sdist on PyPI, into a
# cache outside the clone. Prints the binary's path; does nothing more when
# that binary is already there.
#   scripts/build-llama-server.sh            build (or find) it
#   scripts/build-llama-server.sh --path     print where it is (or will be)
# The sdist is the newest on PyPI, whose llama.cpp is the closest to the one
# llama-cpp-sys-2 vendors (ours is a little newer; the bench prints both).
# llama.cpp's defaults are kept (GGML_NATIVE, OpenMP, Release) except what
# would reach the internet at build time (the prebuilt Web UI, curl, TLS),
# ggml's AMX kernels on x86_64, which die with SIGILL on some hosts that
# list AMX (see the Makefile), and llamafile's tinyBLAS, which our own build
# leaves out too (.cargo/config.toml): with the same kernels on both sides,
# a comparison measures the servers, and vectors and greedy text compare
# exactly (llamafile multiplies attention in another order: an embedding
# moved 1.6e-4 cosine distance). The cache folder's name says so, so a
# build made with them is not reused.
set -euo pipefail
version=0.3.36
sum=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
python=${PYTHON:-python3}
cache=${SKILLHOST_CACHE:-$HOME/.cache/skillhost}/llama-server
flags=
if [ "$(uname -m)" = x86_64 ]; then
  flags="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
fi
binary=$cache/llama-cpp-python-$version${flags:+-noamx}-nollamafile/bin/llama-server
if [ "${1:-}" = --path ] || [ -x "$binary" ]; then
  echo "$binary"
  exit 0
fi
mkdir -p "$cache"
tmp=$(mktemp -d "$cache/build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
"$python" -m pip download --quiet --no-deps --no-binary :all: --dest "$tmp" "llama-cpp-python==$version" >&2
sdist=$tmp/llama_cpp_python-$version.tar.gz
[ "$(sha256sum "$sdist" | cut -d' ' -f1)" = "$sum" ] || { echo "checksum mismatch: $sdist" >&2; exit 1; }
tar -xzf "$sdist" -C "$tmp"
src=$tmp/llama_cpp_python-$version/vendor/llama.cpp
cmake -S "$src" -B "$tmp/build" -DCMAKE_BUILD_TYPE=Release \
  -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
  -DGGML_LLAMAFILE=OFF -DBUILD_SHARED_LIBS=OFF -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" >&2
cmake --build "$tmp/build" --target llama-server -j "$(nproc)" >&2
mkdir -p "$(dirname "$binary")"
cp "$tmp/build/bin/llama-server" "$binary.part"
mv "$binary.part" "$binary"
echo "$binary"
