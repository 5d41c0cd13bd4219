#!/usr/bin/env bash
# Builds the Tandem image (the same image as deploy/image/Containerfile's runtime stage) with no
# container registry: debootstrap a minimal Debian 12 root from Debian's archive, run
# runtime-setup.sh in it (the runtime libraries, the tandem user), copy an existing build of
# tandem and the bundled model in, and pack it as an OCI image with umoci. Needs root, and the
# Debian packages debootstrap and umoci (apt-get install debootstrap umoci).
#
#   deploy/image/build-offline.sh [--binary PATH] [--model DIR] [--output FILE] [--tag TAG]
#       [--mirror URL] [--security-mirror URL] [--workdir DIR] [--keep-work]
#
#   --binary PATH   tandem built for Debian 12 with TANDEM_CUDA=OFF (default: build/tandem)
#   --model DIR     model directory baked in as /opt/tandem/models/target (default: models/target)
#   --output FILE   OCI archive written (default: ${TMPDIR:-/tmp}/tandem-image.oci.tar);
#                   load it with `podman load -i FILE` or `skopeo copy oci-archive:FILE ...`
#   --tag TAG       tag inside the archive (default: latest)
#   --mirror URL    Debian archive (default: http://deb.debian.org/debian)
#   --security-mirror URL   (default: http://deb.debian.org/debian-security)
#   --workdir DIR   scratch directory, about 400 MB (default: a new directory under ${TMPDIR:-/tmp})
#   --keep-work     keep the scratch directory (the root file system and the OCI layout)
#
# It does not build tandem: it copies the binary it is given (build it first with
# `TANDEM_CUDA=OFF ./quickstart build`).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)

binary=$repo/build/tandem
model=$repo/models/target
output=${TMPDIR:-/tmp}/tandem-image.oci.tar
tag=latest
mirror=http://deb.debian.org/debian
security_mirror=http://deb.debian.org/debian-security
workdir=
keep_work=0
suite=bookworm

if [[ -t 2 ]]; then b=$'\033[1m' r=$'\033[1;31m' n=$'\033[0m'; else b='' r='' n=''; fi
die() { printf '%s[build-offline] error:%s %s\n' "$r" "$n" "$*" >&2; exit 1; }
usage() { sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

while (($#)); do
  case $1 in
    --binary) binary=${2:?--binary needs a path}; shift 2 ;;
    --model) model=${2:?--model needs a directory}; shift 2 ;;
    --output) output=${2:?--output needs a file}; shift 2 ;;
    --tag) tag=${2:?--tag needs a value}; shift 2 ;;
    --mirror) mirror=${2:?--mirror needs a URL}; shift 2 ;;
    --security-mirror) security_mirror=${2:?--security-mirror needs a URL}; shift 2 ;;
    --workdir) workdir=${2:?--workdir needs a directory}; shift 2 ;;
    --keep-work) keep_work=1; shift ;;
    -h | --help) usage ;;
    *) printf 'unknown argument: %s\n\n' "$1" >&2; usage ;;
  esac
done

steps=8
step_no=0
t_start=$(date +%s)
t_step=$t_start
step() {
  local now
  now=$(date +%s)
  if ((step_no > 0)); then
    printf '%s[build-offline]%s   done in %ds\n' "$b" "$n" $((now - t_step)) >&2
  fi
  t_step=$now
  step_no=$((step_no + 1))
  printf '%s[build-offline] [%d/%d]%s %s\n' "$b" "$step_no" "$steps" "$n" "$*" >&2
}
info() { printf '[build-offline]   %s\n' "$*" >&2; }

# ---- 1. Preconditions: root, the tools, a CPU build, a model. ----
step "checking root, tools, binary and model"
(($(id -u) == 0)) || die "run as root (debootstrap and chroot need it): sudo $0 $*"
missing=()
for tool in debootstrap umoci chroot ldd tar gzip mount mountpoint dpkg; do
  command -v "$tool" >/dev/null || missing+=("$tool")
done
((${#missing[@]} == 0)) || die "missing tools: ${missing[*]} (apt-get install debootstrap umoci)"
[[ -f $binary && -x $binary ]] || die "no tandem binary at $binary (build it: TANDEM_CUDA=OFF ./quickstart build, or pass --binary PATH)"
[[ -f $model/config.json ]] || die "no model at $model (a directory with config.json; pass --model DIR)"
binary=$(readlink -f "$binary")
model=$(readlink -f "$model")
[[ $tag =~ ^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$ ]] || die "bad tag '$tag'"
# Every library the binary loads must come from a Debian package, which the image then installs
# (runtime-setup.sh). A CUDA build links libcudart/libcublasLt from /usr/local/cuda: not here.
foreign=()
while read -r lib path; do
  if [[ $path == "not" ]]; then
    foreign+=("$lib (not found on this machine)")
  elif ! dpkg -S "$(readlink -f "$path")" >/dev/null 2>&1 && ! dpkg -S "$path" >/dev/null 2>&1; then
    foreign+=("$lib ($path)")
  fi
done < <(ldd "$binary" | awk '$2 == "=>" {print $1, $3}')
if ((${#foreign[@]})); then
  die "$binary links libraries that no Debian package provides: ${foreign[*]}.
  A CUDA build (TANDEM_CUDA=ON) cannot go into the generic image: build one without CUDA, e.g.
  BUILD_DIR=build-cpu TANDEM_CUDA=OFF ./quickstart build, then --binary build-cpu/tandem
  (the CUDA image: deploy/image/README.md)"
fi
info "binary $binary ($(du -h "$binary" | cut -f1)), model $model ($(du -sh "$model" | cut -f1))"
if [[ -r /etc/os-release ]] && ! grep -q '^VERSION_CODENAME=bookworm$' /etc/os-release; then
  info "warning: this machine is not Debian 12; the binary's libraries are checked in the image"
fi

if [[ -z $workdir ]]; then
  workdir=$(mktemp -d "${TMPDIR:-/tmp}/tandem-image.XXXXXX")
else
  mkdir -p "$workdir"
  [[ -z $(ls -A "$workdir") ]] || die "--workdir $workdir is not empty"
fi
layout=$workdir/oci
bundle=$workdir/bundle
rootfs=$bundle/rootfs
mounted=()
unmount_all() {
  local m
  for m in "${mounted[@]}"; do umount -l "$m" 2>/dev/null || true; done
  mounted=()
  for m in "$rootfs/proc" "$rootfs/dev"; do
    if mountpoint -q "$m" 2>/dev/null; then return 1; fi
  done
}
cleanup() {
  if ! unmount_all; then
    info "warning: $rootfs/proc or /dev still mounted: not deleting $workdir"
  elif ((keep_work)); then
    info "kept $workdir"
  else
    rm -rf --one-file-system "$workdir"
  fi
}
trap cleanup EXIT
in_root() { chroot "$rootfs" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root "$@"; }

# ---- 2. An empty OCI image, unpacked: umoci gives the bundle whose rootfs we fill. ----
step "creating the OCI layout in $layout"
umoci init --layout "$layout"
umoci new --image "$layout:$tag"
umoci unpack --image "$layout:$tag" "$bundle" >/dev/null

# ---- 3. A minimal Debian 12 root from Debian's archive. ----
step "debootstrap --variant=minbase $suite from $mirror (a few minutes: downloads ~90 packages)"
debootstrap --variant=minbase --arch=amd64 "$suite" "$rootfs" "$mirror" 2>&1 |
  awk '/^I: (Retrieving|Validating|Extracting|Unpacking|Configuring) / {
         n[$2]++; if (n[$2] % 30 != 1) next; $0 = $0 " (" n[$2] ")"}
       {print "  " $0; fflush()}' >&2
[[ -x $rootfs/usr/bin/apt-get ]] || die "debootstrap failed (no apt-get in $rootfs)"
# Same sources as debian:12-slim: the release, its updates and the security archive.
rm -f "$rootfs/etc/apt/sources.list"
cat >"$rootfs/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $mirror
Suites: $suite $suite-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $security_mirror
Suites: $suite-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
cp /etc/resolv.conf "$rootfs/etc/resolv.conf" 2>/dev/null || true

# ---- 4. runtime-setup.sh install: the runtime libraries and the user (the Containerfile's RUN). ----
step "runtime-setup.sh install (apt-get install the runtime libraries, user tandem)"
mount -t proc proc "$rootfs/proc" && mounted+=("$rootfs/proc")
mount --bind /dev "$rootfs/dev" && mounted+=("$rootfs/dev")
install -D -m 0644 "$here/runtime-setup.sh" "$rootfs/usr/local/share/tandem/runtime-setup.sh"
in_root sh /usr/local/share/tandem/runtime-setup.sh install 2>&1 | sed -u 's/^/  /' >&2

# ---- 5. The binary and the model (the Containerfile's COPY --from=build). ----
step "copying tandem to /usr/local/bin and the model to /opt/tandem/models/target"
install -m 0755 "$binary" "$rootfs/usr/local/bin/tandem"
mkdir -p "$rootfs/opt/tandem/models/target"
cp -a "$model/." "$rootfs/opt/tandem/models/target/"
chown -R 0:0 "$rootfs/opt/tandem/models/target"
chmod -R a+rX,go-w "$rootfs/opt/tandem/models/target"

# ---- 6. runtime-setup.sh check (the Containerfile's last RUN). ----
step "runtime-setup.sh check (libraries resolve, tandem runs as uid 10001)"
in_root sh /usr/local/share/tandem/runtime-setup.sh check 2>&1 | sed -u 's/^/  /' >&2
unmount_all || die "could not unmount $rootfs/proc and $rootfs/dev"
# Host-specific files debootstrap leaves: the image gets them from the runtime (as debian:12-slim).
: >"$rootfs/etc/resolv.conf"
: >"$rootfs/etc/hostname"
# /dev comes from the container runtime (debootstrap's device nodes do not go into the layer).
rm -rf --one-file-system "${rootfs:?}"/dev/* "${rootfs:?}"/var/cache/apt/archives/*.deb "${rootfs:?}"/tmp/* "${rootfs:?}"/var/tmp/* \
  "$rootfs"/root/.bash_history "$rootfs"/debootstrap
unpacked=$(du -sb --apparent-size "$rootfs" | cut -f1)
info "root file system: $((unpacked / 1024 / 1024)) MiB unpacked"

# ---- 7. Pack: one layer, the image config of the Containerfile. ----
step "umoci repack and config (entrypoint tandem, user 10001, port 8000)"
umoci repack --image "$layout:$tag" --history.created_by "deploy/image/build-offline.sh" "$bundle"
umoci config --image "$layout:$tag" \
  --author "Tandem" \
  --config.user 10001:10001 \
  --config.workingdir /opt/tandem \
  --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  --config.env HOME=/home/tandem \
  --config.exposedports 8000/tcp \
  --config.entrypoint tandem \
  --config.cmd serve --config.cmd --model --config.cmd /opt/tandem/models/target \
  --config.cmd --host --config.cmd 0.0.0.0 --config.cmd --port --config.cmd 8000 \
  --config.label org.opencontainers.image.title=tandem \
  --config.label org.opencontainers.image.description="Tandem disaggregated LLM serving (CPU), bundled model at /opt/tandem/models/target" \
  --config.label org.opencontainers.image.base.name=debian:12 \
  --history.created_by 'ENTRYPOINT ["tandem"] CMD ["serve", "--model", "/opt/tandem/models/target", "--host", "0.0.0.0", "--port", "8000"]'
umoci gc --layout "$layout"
chmod -R a+rX "$layout"

# ---- 8. One OCI archive. ----
step "writing $output"
mkdir -p "$(dirname "$output")"
tar -C "$layout" --numeric-owner --owner=0 --group=0 -cf "$output.part" .
mv "$output.part" "$output"
layer_bytes=$(find "$layout/blobs/sha256" -type f -size +1M -printf '%s\n' | sort -n | tail -1)
now=$(date +%s)
printf '%s[build-offline]%s   done in %ds\n' "$b" "$n" $((now - t_step)) >&2
printf '%s[build-offline]%s OCI image %s (tag %s) in %ds: layer %d MiB compressed (gzip), %d MiB unpacked, archive %s (%d MiB)\n' "$b" "$n" \
  "$(basename "$output")" "$tag" $((now - t_start)) $((layer_bytes / 1024 / 1024)) \
  $((unpacked / 1024 / 1024)) "$output" $(($(stat -c %s "$output") / 1024 / 1024)) >&2
printf '[build-offline] load it: podman load -i %s   (or: skopeo copy oci-archive:%s:%s containers-storage:localhost/tandem:latest)\n' \
  "$output" "$output" "$tag" >&2
