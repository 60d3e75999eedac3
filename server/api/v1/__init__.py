"""Generated code for ``proto/tuner/v1/tuner.proto`` (package ``tuner.v1``).

Regenerate with ``scripts/gen_proto.sh``; ``scripts/check_generated.sh`` fails when these
files are stale. Import ``server.api.v1.tuner_pb2`` and ``server.api.v1.tuner_pb2_grpc``.
"""
