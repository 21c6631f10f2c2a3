#!/usr/bin/env bash
# Generates a CA and a serving certificate for dkc-server (valid 1 year) into this directory.
set -euo pipefail
cd "$(dirname "$0")"
openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=dkc-ca" -keyout ca.key -out ca.crt 2>/dev/null
openssl req -newkey rsa:2048 -nodes -subj "/CN=dkc-server" -keyout tls.key -out tls.csr 2>/dev/null
printf 'subjectAltName=DNS:dkc-server,DNS:dkc-server.kube-system,DNS:dkc-server.kube-system.svc,DNS:dkc-server.kube-system.svc.cluster.local\nextendedKeyUsage=serverAuth\n' > tls.ext
openssl x509 -req -in tls.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 365 -extfile tls.ext -out tls.crt 2>/dev/null
rm -f tls.csr tls.ext ca.srl
echo "wrote ca.crt, tls.crt, tls.key (keep ca.key offline to renew)"
