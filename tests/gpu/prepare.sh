#!/usr/bin/env bash
# Run HERE (the dev machine) before a device call: gathers into .dev/ (ignored, carried with `carry: [".dev"]`) what the
# GPU machine lacks: this machine's sshd and ssh-keygen with their libraries, and the controller's packages as wheels
# for its Python 3.12. See tests/gpu/README.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx '/.dev/' .git/info/exclude || echo /.dev/ >> .git/info/exclude
rm -rf .dev/whl  # one version of each package: two stop the install there
mkdir -p .dev/ssh/lib .dev/whl
cp /usr/sbin/sshd /usr/bin/ssh-keygen .dev/ssh/
for lib in $( (ldd /usr/sbin/sshd; ldd /usr/bin/ssh-keygen) | awk '/=>/{print $3}' | sort -u); do
    case $(basename "$lib") in libc.so*|libm.so*|libresolv.so*|libpthread*|libdl*) ;; *) cp -L "$lib" .dev/ssh/lib/;; esac
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux_2_34_x86_64 -d .dev/whl fabric invoke==2.2.1 paramiko cryptography cffi pycparser bcrypt \
    pynacl decorator deprecated==1.3.1 python-dotenv pathspec
# the page's extra (matplotlib and what it needs; numpy too, for an image without it: pip takes the image's own first)
rm -rf .dev/whl-report && mkdir -p .dev/whl-report
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux_2_34_x86_64 -d .dev/whl-report "matplotlib>=3.5"
cp tests/gpu/device_check.sh tests/gpu/gpu_hang.py .dev/
echo "ready: run(command='PYTHONUNBUFFERED=1 bash .dev/device_check.sh all', carry=['.dev'], timeout_s=540)"
