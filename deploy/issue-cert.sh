#!/usr/bin/env bash
# A certificate for one Cumulus process, with openssl, for clusters that
# do not run cert-manager (systemd hosts, scripts/cluster-netns.sh):
#
#   deploy/issue-cert.sh DIR CLUSTER ROLE NAME [SAN...]
#
# writes DIR/NAME.crt and DIR/NAME.key (ECDSA P-256, DAYS days, default
# 90), signed by the CA in DIR/ca.crt and DIR/ca.key, which it makes
# (for ten years) when DIR holds none. ROLE is what the processes check
# (--tls-roles): shard, router, manager, operator or trainer, carried as
# the URI SAN spiffe://CLUSTER/ROLE/NAME; "none" issues a certificate
# without a role (etcd's own). CLUSTER is the processes' --cluster
# ("default" unless given). Each SAN is openssl's: IP:10.0.0.10,
# DNS:host-a.example. The certificate is good for servers and clients.
#
#   deploy/issue-cert.sh pki default shard host-a DNS:host-a   # then copy pki/host-a.* and pki/ca.crt to host-a
#
# Keep DIR, with ca.key, off the cluster's hosts.
set -euo pipefail
if [ $# -lt 4 ]; then
  sed -n '2,19s/^# \{0,1\}//p' "$0" >&2
  exit 2
fi
dir=$1 cluster=$2 role=$3 name=$4
shift 4
[[ $cluster =~ ^[A-Za-z0-9-]{1,63}$ ]] || { echo "issue-cert: cluster $cluster: 1 to 63 letters, digits or '-'" >&2; exit 2; }
cluster=${cluster,,} # a SPIFFE trust domain is lowercase
case $role in
  shard | router | manager | operator | trainer) sans=("URI:spiffe://$cluster/$role/$name") ;;
  none) sans=() ;;
  *) echo "issue-cert: role $role: use shard, router, manager, operator, trainer or none" >&2; exit 2 ;;
esac
[[ $name =~ ^[A-Za-z0-9._-]+$ && $name != ca && $name != . && $name != .. ]] ||
  { echo "issue-cert: name $name: letters, digits, '.', '_' or '-' (not ca: that is the CA's)" >&2; exit 2; }
for san in "$@"; do
  [[ $san =~ ^(IP|DNS):[A-Za-z0-9.:*_-]+$ ]] || { echo "issue-cert: SAN $san: use IP:ADDRESS or DNS:NAME" >&2; exit 2; }
done
sans+=("$@")
[ ${#sans[@]} -gt 0 ] || { echo "issue-cert: a certificate without a role needs a SAN (IP:... or DNS:...)" >&2; exit 2; }

mkdir -p "$dir"
umask 077
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# quiet COMMAND...: openssl, its chatter shown only if it fails.
quiet() { "$@" 2> "$tmp/err" || { cat "$tmp/err" >&2; exit 1; }; }
if [ ! -e "$dir/ca.key" ]; then
  quiet openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$dir/ca.key" \
    -out "$dir/ca.crt" -days 3650 -subj "/CN=cumulus-$cluster-ca"
  chmod 644 "$dir/ca.crt"
fi
IFS=,
printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\nkeyUsage=critical,digitalSignature\n' "${sans[*]}" > "$tmp/ext"
unset IFS
quiet openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$dir/$name.key" \
  -out "$tmp/csr" -subj "/CN=$name"
quiet openssl x509 -req -in "$tmp/csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" -CAcreateserial \
  -days "${DAYS:-90}" -extfile "$tmp/ext" -out "$dir/$name.crt"
chmod 644 "$dir/$name.crt"
