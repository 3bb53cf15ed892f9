"""Regenerate the gRPC stubs from grpc_predict_v2.proto.

    pip install 'grpcio-tools<1.80' && python -m unideploy.server.protocol.generate

grpcio-tools before 1.80 writes protobuf gencode 6.31, which imports under protobuf 6 and 7 alike
(generated code refuses a runtime older than its gencode); tritonclient still needs protobuf < 7.
"""

from __future__ import annotations

import re
from pathlib import Path

HERE = Path(__file__).parent


def main() -> None:
    from grpc_tools import protoc

    code = protoc.main(
        [
            "protoc",
            f"-I{HERE}",
            f"--python_out={HERE}",
            f"--grpc_python_out={HERE}",
            str(HERE / "grpc_predict_v2.proto"),
        ]
    )
    if code:
        raise SystemExit(code)
    stub = HERE / "grpc_predict_v2_pb2_grpc.py"  # make its import of the messages package-relative
    stub.write_text(
        re.sub(r"^import grpc_predict_v2_pb2", "from . import grpc_predict_v2_pb2", stub.read_text(), flags=re.M)
    )


if __name__ == "__main__":
    main()
