#!/usr/bin/env bash
# Credentials for a TLS + SuperNode-authenticated Flower federation (openssl, ssh-keygen).
#
# Usage: scripts/make_certs.sh [--out DIR] [--nodes N] [--host NAME]...
#   --out DIR     output folder (default $HOME/.fedul-flwr/certificates, outside the repository);
#                 existing files are never overwritten
#   --owner U:G   who may read the private keys the containers use, server.key and the
#                 supernode-<i> keys this run creates (default 49999:49999, the user Flower's
#                 Docker images run as); applied when run as root, else the chown to run is
#                 printed. Nothing else changes owner: not ca.key, not the folder, not a file
#                 that was there before
#   --nodes N     number of SuperNode key pairs (default 3)
#   --host NAME   a DNS name or IP address the SuperLink is reached by; repeatable
#                 (default: localhost, 127.0.0.1, ::1). Put your server's name here.
#   --days D      validity of the certificates (default 365)
#
# Writes:
#   DIR/ca.crt, DIR/ca.key             a local certificate authority (keep ca.key private)
#   DIR/server.pem, DIR/server.key     the SuperLink's TLS certificate (SANs = --host values)
#   DIR/supernode-<i>, -<i>.pub        SuperNode i's ECDSA P-384 key pair (OpenSSH format)
#
# SuperLink:  flower-superlink --ssl-ca-certfile DIR/ca.crt --ssl-certfile DIR/server.pem \
#               --ssl-keyfile DIR/server.key --enable-supernode-auth ...
# register:   flwr supernode register DIR/supernode-<i>.pub <connection>   (once per node)
# SuperNode:  flower-supernode --root-certificates DIR/ca.crt \
#               --auth-supernode-private-key DIR/supernode-<i> ...
# CLI:        root-certificates = "DIR/ca.crt" in the connection of $FLWR_HOME/config.toml
set -euo pipefail

OUT="${HOME}/.fedul-flwr/certificates"
OWNER="49999:49999"
NODES=3
DAYS=365
HOSTS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --out) OUT="$2"; shift 2 ;;
    --nodes) NODES="$2"; shift 2 ;;
    --host) HOSTS+=("$2"); shift 2 ;;
    --days) DAYS="$2"; shift 2 ;;
    --owner) OWNER="$2"; shift 2 ;;
    -h|--help) sed -n '2,27p' "$0"; exit 0 ;;
    *) echo "unknown option: $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ ${#HOSTS[@]} -gt 0 ]] || HOSTS=(localhost 127.0.0.1 ::1)

mkdir -p "$OUT"
for f in ca.crt ca.key server.pem server.key; do
  if [[ -e "$OUT/$f" ]]; then echo "$OUT/$f exists; refusing to overwrite (use another --out)" >&2; exit 1; fi
done

SAN=""
for h in "${HOSTS[@]}"; do
  if [[ "$h" =~ ^[0-9.]+$ || "$h" == *:* ]]; then SAN+="IP:$h,"; else SAN+="DNS:$h,"; fi
done
SAN="${SAN%,}"

umask 077
# certificate authority
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:secp384r1 -sha384 -nodes -days "$DAYS" \
  -keyout "$OUT/ca.key" -out "$OUT/ca.crt" -subj "/O=fedul-flwr/CN=fedul-flwr local CA" 2>/dev/null
# SuperLink certificate, signed by the CA
openssl req -newkey ec -pkeyopt ec_paramgen_curve:secp384r1 -sha384 -nodes -keyout "$OUT/server.key" -out "$OUT/server.csr" \
  -subj "/O=fedul-flwr/CN=${HOSTS[0]}" 2>/dev/null
printf 'subjectAltName=%s\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n' \
  "$SAN" > "$OUT/server.ext"
openssl x509 -req -in "$OUT/server.csr" -CA "$OUT/ca.crt" -CAkey "$OUT/ca.key" -CAcreateserial \
  -out "$OUT/server.pem" -days "$DAYS" -sha384 -extfile "$OUT/server.ext" 2>/dev/null
rm -f "$OUT/server.csr" "$OUT/server.ext" "$OUT/ca.srl"
chmod 644 "$OUT/ca.crt" "$OUT/server.pem"

# SuperNode authentication key pairs (ECDSA on NIST P-384, as Flower requires); a key that
# exists is kept as it is
CONTAINER_KEYS=("$OUT/server.key")  # the private keys a container reads, created by this run
for ((i = 0; i < NODES; i++)); do
  key="$OUT/supernode-$i"
  if [[ ! -e "$key" ]]; then
    ssh-keygen -q -t ecdsa -b 384 -N "" -C "fedul-supernode-$i" -f "$key"
    CONTAINER_KEYS+=("$key")
  fi
done

openssl verify -CAfile "$OUT/ca.crt" "$OUT/server.pem" > /dev/null
echo "wrote $OUT: ca.crt, server.pem/.key (SAN $SAN), $NODES SuperNode key pairs supernode-<i>[.pub]"
# private keys stay mode 600; the containers' user must own those it reads. The CA key, the
# folder and every file that was there before keep their owner (certificates and public keys
# are world-readable, mode 644)
if [[ "$(id -u)" == 0 ]]; then
  chown "$OWNER" "${CONTAINER_KEYS[@]}" && echo "handed ${CONTAINER_KEYS[*]} to $OWNER (the containers' user)"
else
  echo "for the Docker images (uid ${OWNER%%:*}): sudo chown $OWNER ${CONTAINER_KEYS[*]}   (they stay private, mode 600)"
fi
