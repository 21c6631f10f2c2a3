#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0

# TLS for dkc with a CA of your own, in this directory (openssl). After each command, `kubectl apply -k` the
# overlay that uses this directory; the files stay here for the next command (keep this directory, and
# ca.key in it, private).
#
#   ./gen-certs.sh                 first install: a CA (ca.key, ca.crt; 10 years) and dkc-server's serving
#                                  certificate (tls.crt, tls.key; 1 year) signed by it. Run again, it makes
#                                  a new CA outright: not for a running install (see rotate)
#   ./gen-certs.sh renew           a new serving certificate from the same CA (before tls.crt expires); no
#                                  sidecar notices: they trust the CA, and dkc-server reloads tls.crt itself
#   ./gen-certs.sh rotate start    CA rotation, step 1: a new CA; ca.crt becomes the bundle old + new
#   ./gen-certs.sh rotate switch   step 2: tls.crt from the new CA
#   ./gen-certs.sh rotate finish   step 3: ca.crt is the new CA alone; the old CA is deleted
#   ./gen-certs.sh status          which step this directory is at
#
# ca.crt is what everything that verifies dkc-server trusts: the sidecars (ConfigMap dkc-server-ca, read again
# at every connection) and the kube-apiserver calling the admission webhook (its caBundle). A rotation never
# leaves them unable to verify dkc-server: each step is applied only once the one before has reached every
# node. Between steps, wait until the kubelets have refreshed the ConfigMap volume: at most the kubelet's
# --sync-frequency (1m) plus its ConfigMap cache; 2 minutes is safe. dkc-server picks up a new tls.crt
# within 10 s of its Secret volume changing, and connections made before keep working.
set -euo pipefail
cd "$(dirname "$0")"

# 127.0.0.1: the address of `kubectl port-forward svc/dkc-server`, so that grpcurl through one verifies the
# certificate without -servername (only whoever holds tls.key can serve it, wherever it is reached).
# NAMESPACE: where dkc-server's Service is (default kube-system, as deploy/base installs it); dkc-server
# refuses to start with a certificate for another namespace's Service (--namespace).
NS="${NAMESPACE:-kube-system}"
SAN="subjectAltName=DNS:dkc-server,DNS:dkc-server.$NS,DNS:dkc-server.$NS.svc,DNS:dkc-server.$NS.svc.cluster.local,IP:127.0.0.1"

die() { echo "gen-certs.sh: $*" >&2; exit 1; }

new_ca() { # new_ca KEY CERT CN
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=$3" -keyout "$1" -out "$2" 2>/dev/null
}

# serving CA_CERT CA_KEY: tls.crt and tls.key for dkc-server.$NS.svc, 1 year, replaced by rename.
serving() {
  openssl req -newkey rsa:2048 -nodes -subj "/CN=dkc-server" -keyout tls.key.new -out tls.csr 2>/dev/null
  printf '%s\nextendedKeyUsage=serverAuth\n' "$SAN" > tls.ext
  openssl x509 -req -in tls.csr -CA "$1" -CAkey "$2" -set_serial "0x$(openssl rand -hex 16)" -days 365 \
    -extfile tls.ext -out tls.crt.new 2>/dev/null
  rm -f tls.csr tls.ext
  mv tls.key.new tls.key
  mv tls.crt.new tls.crt
}

rotating() { [[ -f next-ca.key ]]; }

step() {
  if ! [[ -f ca.key ]]; then echo "none: run ./gen-certs.sh"; return; fi
  if ! rotating; then echo "installed: no rotation in progress"; return; fi
  if openssl verify -CAfile next-ca.crt tls.crt >/dev/null 2>&1; then
    echo "rotation switched: tls.crt is from the new CA; next: rotate finish"
  else
    echo "rotation started: ca.crt holds the old and the new CA; next: rotate switch"
  fi
}

case "${1:-}" in
"")
  if [[ -f ca.key || -f ca.crt ]]; then
    # As this script always did (the dev cluster and tests run it on copies of a checkout that may hold an
    # earlier run's files), but a running install must not get here: applying a CA its sidecars do not
    # trust yet cuts every one of them off until they see the new ConfigMap.
    echo "gen-certs.sh: replacing the CA in $(pwd): sidecars that trust the old one cannot connect once this is applied." >&2
    echo "gen-certs.sh: to change the CA of a running install, use: $0 rotate start|switch|finish" >&2
    rm -f next-ca.key next-ca.crt old-ca.crt
  fi
  new_ca ca.key ca.crt dkc-ca
  serving ca.crt ca.key
  echo "wrote ca.crt, tls.crt, tls.key; now: kubectl apply -k <your overlay> (keep ca.key private, to renew and rotate)"
  ;;
renew)
  [[ -f ca.key ]] || die "no ca.key here: nothing to renew from (./gen-certs.sh first)"
  rotating && die "a CA rotation is in progress ($(step)); finish it first"
  serving ca.crt ca.key
  echo "wrote tls.crt, tls.key from the same CA; now: kubectl apply -k <your overlay>"
  ;;
rotate)
  [[ -f ca.key ]] || die "no ca.key here: nothing to rotate (./gen-certs.sh first)"
  case "${2:-}" in
  start)
    rotating && die "a rotation is in progress already: $(step)"
    # The old CA, alone, for the bundle (ca.crt holds only the current CA outside a rotation).
    cp ca.crt old-ca.crt
    new_ca next-ca.key next-ca.crt "dkc-ca-$(date -u +%Y%m%d%H%M%S)"
    cat old-ca.crt next-ca.crt > ca.crt.new && mv ca.crt.new ca.crt
    echo "ca.crt now trusts the old and the new CA; tls.crt is unchanged (old CA)."
    echo "now: kubectl apply -k <your overlay>; wait 2 minutes for every node's ConfigMap volume; then: $0 rotate switch"
    ;;
  switch)
    rotating || die "no rotation in progress (rotate start first)"
    serving next-ca.crt next-ca.key
    echo "tls.crt is now from the new CA, which every sidecar trusts since rotate start."
    echo "now: kubectl apply -k <your overlay>; wait until dkc-server serves it (its Secret volume, then 10 s); then: $0 rotate finish"
    ;;
  finish)
    rotating || die "no rotation in progress (rotate start first)"
    openssl verify -CAfile next-ca.crt tls.crt >/dev/null 2>&1 || die "tls.crt is not from the new CA yet (rotate switch first)"
    # Safe to run again if interrupted: the rotation counts as in progress until next-ca.key is gone.
    cp next-ca.crt ca.crt.new && mv ca.crt.new ca.crt
    mv next-ca.key ca.key
    rm -f next-ca.crt old-ca.crt
    echo "ca.crt is the new CA alone; the old CA is gone from this directory."
    echo "now: kubectl apply -k <your overlay>"
    ;;
  *) die "usage: $0 rotate start|switch|finish" ;;
  esac
  ;;
status) step ;;
*) die "usage: $0 [renew | rotate start|switch|finish | status]" ;;
esac
