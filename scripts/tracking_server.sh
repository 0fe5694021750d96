#!/usr/bin/env bash
# The shared tracking server: `mlflow server` with a PostgreSQL backend and proxied artifacts in
# an S3-compatible store (AWS S3, MinIO, Ceph). Clients need only MLFLOW_TRACKING_URI; the S3
# credentials stay on this host. Needs `pip install -e '.[server]'`. Settings, from the environment:
#   VLAEVAL_BACKEND_STORE_URI      postgresql://mlflow@db:5432/mlflow (the password in PGPASSWORD or
#                                  ~/.pgpass, never in the URI: command lines are visible to `ps`)
#   VLAEVAL_ARTIFACTS_DESTINATION  s3://bucket/prefix
#   MLFLOW_S3_ENDPOINT_URL         the endpoint of a non-AWS store, e.g. http://minio:9000
#   AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY (or any other boto3 credential source)
#   VLAEVAL_SERVER_HOST (0.0.0.0), VLAEVAL_SERVER_PORT (5000), VLAEVAL_SERVER_WORKERS (4)
# tests/test_tracking_server.py runs this script against PostgreSQL and moto's S3 server.
set -euo pipefail
: "${VLAEVAL_BACKEND_STORE_URI:?set VLAEVAL_BACKEND_STORE_URI, e.g. postgresql://mlflow@db:5432/mlflow}"
: "${VLAEVAL_ARTIFACTS_DESTINATION:?set VLAEVAL_ARTIFACTS_DESTINATION, e.g. s3://my-bucket/mlflow}"
mlflow="${MLFLOW:-mlflow}"
exec "$mlflow" server \
    --backend-store-uri "$VLAEVAL_BACKEND_STORE_URI" \
    --serve-artifacts --artifacts-destination "$VLAEVAL_ARTIFACTS_DESTINATION" \
    --host "${VLAEVAL_SERVER_HOST:-0.0.0.0}" --port "${VLAEVAL_SERVER_PORT:-5000}" \
    --workers "${VLAEVAL_SERVER_WORKERS:-4}"
