"""The versioned wire API: code generated from ``proto/`` by ``scripts/gen_proto.sh``."""
