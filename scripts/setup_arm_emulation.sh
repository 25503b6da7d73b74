#!/usr/bin/env bash
# Install what tests/unit/test_arm_variants.py needs to build and run the ARM (aarch64) kernel variants on
# an x86-64 Debian or Ubuntu machine: the cross compiler (g++-aarch64-linux-gnu, which brings the aarch64
# C library under /usr/aarch64-linux-gnu and aarch64-linux-gnu-objdump) and user-mode emulation
# (qemu-user: qemu-aarch64). Without them those tests skip, naming this script.
#
# Usage: scripts/setup_arm_emulation.sh   (as root, or as a user with sudo; does nothing if both are there)
set -euo pipefail

if command -v aarch64-linux-gnu-g++ >/dev/null && command -v qemu-aarch64 >/dev/null; then
  echo "setup_arm_emulation: aarch64-linux-gnu-g++ and qemu-aarch64 are already installed"
  exit 0
fi
if ! command -v apt-get >/dev/null; then
  echo "setup_arm_emulation: needs apt-get (Debian/Ubuntu); install an aarch64 cross g++ and qemu-user" \
    "with your system's package manager" >&2
  exit 1
fi
if [ "$(id -u)" -eq 0 ]; then
  SUDO=()
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
  SUDO=(sudo -n)
else
  echo "setup_arm_emulation: needs root or password-less sudo to run apt-get; as root run:" >&2
  echo "  apt-get update && apt-get install -y g++-aarch64-linux-gnu qemu-user" >&2
  exit 1
fi
"${SUDO[@]}" apt-get update -qq
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq g++-aarch64-linux-gnu qemu-user
aarch64-linux-gnu-g++ --version | head -n 1
qemu-aarch64 --version | head -n 1
