#!/bin/sh
# The runtime stage of the Tandem image, shared by both ways of building it, so that they run the
# same commands: the Containerfile RUNs it inside debian:12-slim, build-offline.sh runs it in a
# chroot of a debootstrapped Debian 12 root. Runs as root inside the image's root file system.
#
#   runtime-setup.sh install   slim dpkg excludes, the runtime libraries, the tandem user
#   runtime-setup.sh check     every library of /usr/local/bin/tandem resolves; it runs as the user
#
# The package list is what `ldd build/tandem` needs, mapped to packages with `dpkg -S` on Debian 12
# (a TANDEM_CUDA=OFF build). Keep it in step with the libraries the build links (README.md here).
set -eu

PACKAGES="
  libabsl20220623
  libc-ares2
  libgfortran5
  libgrpc++1.51
  libgrpc29
  libicu72
  libnuma1
  libopenblas0-pthread
  libpcre2-8-0
  libprometheus-cpp-core1.0
  libprotobuf32
  libquadmath0
  libre2-9
  libssl3
  libstdc++6
  libucx0
  zlib1g
"
TANDEM_UID=10001
TANDEM_HOME=/home/tandem

say() { printf '[runtime-setup] %s\n' "$*" >&2; }

install() {
  # The excludes debian:12-slim ships (/etc/dpkg/dpkg.cfg.d/docker); a debootstrapped root lacks them.
  if [ ! -e /etc/dpkg/dpkg.cfg.d/docker ]; then
    say "dpkg excludes for docs, man pages and locales (as debian:12-slim)"
    cat >/etc/dpkg/dpkg.cfg.d/docker <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/lintian/overrides/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/man/*
EOF
    find /usr/share/doc -mindepth 1 -not -name copyright -not -type d -delete 2>/dev/null || true
    find /usr/share/doc -mindepth 1 -type d -empty -delete 2>/dev/null || true
    rm -rf /usr/share/groff/* /usr/share/info/* /usr/share/linda/* /usr/share/lintian/overrides/* \
      /usr/share/locale/* /usr/share/man/*
  fi

  say "apt-get upgrade, then apt-get install the runtime libraries"
  export DEBIAN_FRONTEND=noninteractive
  apt="apt-get -q -o Acquire::Languages=none -o Dpkg::Use-Pty=0"
  $apt update
  # Both bases (debian:12-slim, a debootstrapped bookworm) then hold the current point release
  # and security updates.
  $apt -y upgrade
  # shellcheck disable=SC2086  # word splitting of the list is intended
  $apt install -y --no-install-recommends $PACKAGES
  apt-get clean
  rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/cache/debconf/*-old /var/log/apt/* \
    /var/log/dpkg.log /var/log/alternatives.log /var/log/bootstrap.log

  say "user tandem (uid $TANDEM_UID), $TANDEM_HOME, /opt/tandem/models"
  getent group tandem >/dev/null || groupadd --gid "$TANDEM_UID" tandem
  # --no-log-init: no sparse /var/log/lastlog entry sized by the uid.
  getent passwd tandem >/dev/null || useradd --no-log-init --uid "$TANDEM_UID" --gid "$TANDEM_UID" \
    --home-dir "$TANDEM_HOME" --create-home --shell /usr/sbin/nologin tandem
  mkdir -p /opt/tandem/models
}

check() {
  say "check: the libraries of /usr/local/bin/tandem"
  if ldd /usr/local/bin/tandem | grep 'not found'; then
    say "error: /usr/local/bin/tandem needs libraries this image lacks (above); a CUDA build?"
    exit 1
  fi
  say "check: tandem runs as the tandem user and sees the bundled model"
  test -f /opt/tandem/models/target/config.json
  setpriv --reuid=tandem --regid=tandem --clear-groups /usr/local/bin/tandem serve --help >/dev/null
}

case "${1:-}" in
  install) install ;;
  check) check ;;
  *) echo "usage: runtime-setup.sh install|check" >&2; exit 2 ;;
esac
