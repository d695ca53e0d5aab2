# What the benchmark scripts need, installed when missing and possible (sourced, not run):
# each `need_*` sets its command's path, or says what is missing and how to install it and
# exits non-zero. Installing needs root for apt-get (Debian's packages) and cargo for oha.

fail_need() {
  echo "$(basename "$0"): $1 is missing and could not be installed; $2" >&2
  exit 1
}

# NGINX: Debian's nginx-light.
need_nginx() {
  NGINX=$(command -v nginx || echo /usr/sbin/nginx)
  if [ ! -x "$NGINX" ]; then
    echo "installing nginx-light" >&2
    apt-get install -y nginx-light >/dev/null 2>&1 || fail_need nginx "run: apt-get install nginx-light"
    NGINX=$(command -v nginx || echo /usr/sbin/nginx)
  fi
}

# OHA: the load generator, the version the figures were taken with.
need_oha() {
  OHA=$(command -v oha || echo "$HOME/.cargo/bin/oha")
  if [ ! -x "$OHA" ]; then
    echo "installing oha 1.16.0 (cargo install, a few minutes)" >&2
    cargo install oha --version 1.16.0 --locked >/dev/null 2>&1 \
      || fail_need oha "run: cargo install oha --version 1.16.0 --locked"
    OHA=$(command -v oha || echo "$HOME/.cargo/bin/oha")
  fi
}

# A Debian package's command: `need_package COMMAND PACKAGE`.
need_package() {
  if ! command -v "$1" >/dev/null; then
    echo "installing $2" >&2
    apt-get install -y "$2" >/dev/null 2>&1 || fail_need "$1" "run: apt-get install $2"
  fi
}
