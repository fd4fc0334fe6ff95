#!/usr/bin/env bash
# Build llama.cpp's llama-server from source for benchmarks/backend/llamacpp.py (not a project dependency).
#
#   bash benchmarks/backend/build_llamacpp.sh            # -> ~/.cache/edgerun/llama.cpp/bin/llama-server
#
# The source is the llama.cpp tree vendored in the llama-cpp-python sdist (a package registry is all
# these machines reach); needs cmake and a C++ compiler (apt-get install cmake g++). CPU only, tuned
# for this machine (GGML_NATIVE), no web UI, no HTTPS. On 2 shared cores it takes a while: it runs
# under nice, and an interrupted build resumes where it stopped.
set -euo pipefail

VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
CACHE="${EDGERUN_LLAMA_CPP_DIR:-$HOME/.cache/edgerun/llama.cpp}"
PYTHON="${PYTHON:-python3}"
JOBS="${JOBS:-2}"

mkdir -p "$CACHE"
cd "$CACHE"
if [ ! -f "llama_cpp_python-$VERSION.tar.gz" ]; then
    "$PYTHON" -m pip download --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d .
fi
SRC="$CACHE/llama_cpp_python-$VERSION/vendor/llama.cpp"
[ -d "$SRC" ] || tar xzf "llama_cpp_python-$VERSION.tar.gz"
cmake -S "$SRC" -B "$SRC/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=ON \
    -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF
nice -n 10 cmake --build "$SRC/build" --target llama-server -j "$JOBS"
mkdir -p "$CACHE/bin"
ln -sf "$SRC/build/bin/llama-server" "$CACHE/bin/llama-server"
echo "$CACHE/bin/llama-server"
