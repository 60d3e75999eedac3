#!/usr/bin/env bash
# Fail (exit 1) when server/api/v1/ differs from what scripts/gen_proto.sh generates now.
#
# CI runs this after installing the `dev` extra: an edited .proto without regenerated code,
# or a hand edit of generated code, shows up as a diff here.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
fresh="$(mktemp -d)"
trap 'rm -rf "$fresh"' EXIT

"$root/scripts/gen_proto.sh" "$fresh" >/dev/null
status=0
for name in tuner_pb2.py tuner_pb2.pyi tuner_pb2_grpc.py; do
    if ! diff -u "$root/server/api/v1/$name" "$fresh/$name"; then
        status=1
    fi
done
if [[ $status -ne 0 ]]; then
    echo "check_generated.sh: server/api/v1 is stale; run scripts/gen_proto.sh and commit" >&2
else
    echo "check_generated.sh: server/api/v1 is up to date"
fi
exit $status
