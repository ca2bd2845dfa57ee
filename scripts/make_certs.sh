#!/usr/bin/env bash
# Credentials for a TLS + SuperNode-authenticated Flower federation (openssl, ssh-keygen).
#
# Usage: scripts/make_certs.sh [--out DIR] [--nodes N] [--host NAME]... [--owner U:G]
#   --out DIR     output folder (default $HOME/.fedul-flwr/certificates, outside the repository);
#                 existing files are never overwritten
#   --nodes N     number of SuperNode key pairs (default 3)
#   --host NAME   a DNS name or IP address the SuperLink is reached by; repeatable
#                 (default: localhost, 127.0.0.1, ::1). Put your server's name here.
#   --days D      validity of the certificates (default 365)
#   --owner U:G   the user (and group) that runs the SuperLink and SuperNodes and so must read
#                 the private keys server.key and supernode-<i> (mode 600, owner only).
#                 Default 49999:49999, the user Flower's Docker images run as. Applied only when
#                 run as root, and only to the private keys this run creates (not to ca.key,
#                 the folder or a file that was there before); run as another user, the keys
#                 stay that user's and the chown to run for Docker is printed.
#                 Bare metal: run this script as the user that runs flower-superlink (keys are
#                 then that user's), or as root with --owner <that user>:<its group>; each
#                 organisation's supernode-<i> is copied to its machine, owned by the user
#                 that runs flower-supernode there.
#
# Writes:
#   DIR/ca.crt, DIR/ca.key             a local certificate authority (keep ca.key private)
#   DIR/server.pem, DIR/server.key     the SuperLink's TLS certificate (SANs = --host values)
#   DIR/supernode-<i>, -<i>.pub        SuperNode i's ECDSA P-384 key pair (OpenSSH format)
#   Certificates and public keys are world-readable (mode 644), private keys mode 600.
#
# SuperLink:  flower-superlink --ssl-ca-certfile DIR/ca.crt --ssl-certfile DIR/server.pem \
#               --ssl-keyfile DIR/server.key --enable-supernode-auth ...
# CLI:        root-certificates = "DIR/ca.crt" in the connection of $FLWR_HOME/config.toml
# register:   flwr supernode register DIR/supernode-<i>.pub <connection>   (once per node)
# SuperNode:  flower-supernode --root-certificates DIR/ca.crt \
#               --auth-supernode-private-key DIR/supernode-<i> ...
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
    -h|--help) sed -n '2,35p' "$0"; exit 0 ;;
    *) echo "unknown option: $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ ${#HOSTS[@]} -gt 0 ]] || HOSTS=(localhost 127.0.0.1 ::1)
[[ "$OWNER" =~ ^[^:[:space:]]+:[^:[:space:]]+$ ]] || { echo "--owner $OWNER: expected USER:GROUP (names or ids)" >&2; exit 2; }
if [[ "$(id -u)" == 0 ]]; then  # an owner chown cannot apply: refuse before writing anything
  probe="$(mktemp)"
  if ! chown "$OWNER" "$probe" 2>/dev/null; then
    rm -f "$probe"; echo "--owner $OWNER: no such user or group on this machine" >&2; exit 2
  fi
  rm -f "$probe"
fi

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
NEW_KEYS=("$OUT/server.key")  # the private keys this run creates: the ones --owner gets
for ((i = 0; i < NODES; i++)); do
  key="$OUT/supernode-$i"
  if [[ ! -e "$key" ]]; then
    ssh-keygen -q -t ecdsa -b 384 -N "" -C "fedul-supernode-$i" -f "$key"
    chmod 644 "$key.pub"  # public: the CLI that registers it may run as another user
    NEW_KEYS+=("$key")
  fi
done

openssl verify -CAfile "$OUT/ca.crt" "$OUT/server.pem" > /dev/null
echo "wrote $OUT: ca.crt, server.pem/.key (SAN $SAN), $NODES SuperNode key pairs supernode-<i>[.pub]"
# private keys stay mode 600: only their owner (and root) reads them. The CA key, the folder and
# every file that was there before keep their owner
if [[ "$(id -u)" == 0 ]]; then
  chown "$OWNER" "${NEW_KEYS[@]}"
  echo "handed ${NEW_KEYS[*]} to $OWNER (mode 600: only that user reads them)"
  if [[ "$OWNER" == 49999:49999 ]]; then
    echo "  49999 is the user of Flower's Docker images; for processes run outside Docker pass --owner <their user>:<group>"
  fi
else
  echo "the private keys are $(id -un)'s (mode 600): a SuperLink or SuperNode run as $(id -un) reads them"
  if [[ "$OWNER" == 49999:49999 ]]; then
    echo "  for Flower's Docker images (uid 49999): sudo chown $OWNER ${NEW_KEYS[*]}"
  else
    echo "  for processes run as $OWNER: sudo chown $OWNER ${NEW_KEYS[*]}"
  fi
fi
