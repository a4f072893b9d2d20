#!/bin/sh
# Installs Moat from this release archive (for machines without dpkg, or
# to keep it out of the package manager):
#   sudo ./install.sh [--prefix DIR] [--no-service]
# Puts moat in DIR/bin and moat-guest in DIR/lib/moat (default DIR:
# /usr/local), and, unless --no-service or systemd is absent, the unit in
# /etc/systemd/system/moat.service (ExecStart pointing at DIR/bin/moat) and
# /etc/default/moat (kept if it exists), then enables and starts it.
# Needs at run time: mmdebstrap (apt-get install mmdebstrap), to build
# images. Uninstall: systemctl disable --now moat; rm DIR/bin/moat
# DIR/bin/moat-runtime DIR/lib/moat/moat-guest
# /etc/systemd/system/moat.service.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
prefix=/usr/local
service=1
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) [ $# -ge 2 ] || { echo "install.sh: --prefix needs a directory" >&2; exit 2; }; prefix=$2; shift ;;
    --no-service) service=0 ;;
    *) echo "install.sh: unknown argument $1 (want --prefix DIR or --no-service)" >&2; exit 2 ;;
  esac
  shift
done
[ "$(id -u)" -eq 0 ] || { echo "install.sh: run as root: moat-guest must be owned by root (moat checks), and moat serve runs as root" >&2; exit 1; }
case "$prefix" in /*) ;; *) echo "install.sh: --prefix $prefix: want an absolute path" >&2; exit 2 ;; esac

# moat runs moat-guest only if it and every directory above it are owned by
# root and writable by no one else: install, never copy with the archive's
# permissions.
install -d -m 0755 "$prefix/bin" "$prefix/lib/moat"
install -m 0755 -o root -g root "$here/lib/moat/moat-guest" "$prefix/lib/moat/moat-guest.new"
mv "$prefix/lib/moat/moat-guest.new" "$prefix/lib/moat/moat-guest"
install -m 0755 -o root -g root "$here/bin/moat" "$prefix/bin/moat.new"
mv "$prefix/bin/moat.new" "$prefix/bin/moat"
# The OCI runtime's name for containerd (BinaryName) and dockerd
# (--add-runtime): moat acts as 'moat oci' when called by it.
ln -sf moat "$prefix/bin/moat-runtime"
echo "installed $("$prefix/bin/moat" version | head -1) at $prefix/bin/moat"
command -v mmdebstrap >/dev/null 2>&1 || echo "note: mmdebstrap is not installed; moat needs it to build images (apt-get install mmdebstrap)" >&2

if [ "$service" = 1 ] && [ -d /run/systemd/system ]; then
  sed "s|^ExecStart=/usr/bin/moat |ExecStart=$prefix/bin/moat |" "$here/share/moat/moat.service" >/etc/systemd/system/moat.service
  [ -f /etc/default/moat ] || install -m 0644 "$here/share/moat/default" /etc/default/moat
  install -d -m 0755 /etc/moat
  systemctl daemon-reload
  systemctl enable --now moat.service
  echo "moat serve runs as moat.service (systemctl status moat); flags in /etc/default/moat"
fi
