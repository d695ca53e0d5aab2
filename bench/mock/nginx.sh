# The zero-delay mock upstream of bench/run.sh and bench/instructions.sh (sourced, not run):
# `start_mock DIR CPU` starts nginx on a free loopback port, pinned to CPU (or unpinned when
# CPU is empty), serving bench/mock/completion.json at /json/v1/chat/completions and
# completion.sse at /sse/v1/chat/completions for any method, and an OTLP/HTTP receiver that
# takes every export at /v1/traces (an empty protobuf answer), keep-alive without limit. Sets
# MOCK_PORT, MOCK_PID (the master) and MOCK_WORKER (its one worker, for CPU accounting).

MOCK_BODIES="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# A file's text as an nginx single-quoted string.
nginx_string() { sed -e "s/\\\\/\\\\\\\\/g" -e "s/'/\\\\'/g" "$1"; }

start_mock() {
  local dir=$1 cpu=$2 nginx
  nginx=$(command -v nginx || echo /usr/sbin/nginx)
  MOCK_PORT=$(free_port)
  mkdir -p "$dir/nginx"
  cat >"$dir/nginx/nginx.conf" <<EOF
worker_processes 1;
daemon off;
pid $dir/nginx/nginx.pid;
error_log $dir/nginx/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $dir/nginx/body;
  proxy_temp_path $dir/nginx/proxy;
  fastcgi_temp_path $dir/nginx/fastcgi;
  uwsgi_temp_path $dir/nginx/uwsgi;
  scgi_temp_path $dir/nginx/scgi;
  keepalive_requests 10000000;
  keepalive_timeout 300s;
  client_body_buffer_size 64k;
  server {
    listen 127.0.0.1:$MOCK_PORT reuseport backlog=4096;
    location = /json/v1/chat/completions {
      default_type application/json;
      return 200 '$(nginx_string "$MOCK_BODIES/completion.json")';
    }
    location = /sse/v1/chat/completions {
      default_type text/event-stream;
      return 200 '$(nginx_string "$MOCK_BODIES/completion.sse")';
    }
    location = /v1/traces {
      default_type application/x-protobuf;
      return 200 '';
    }
  }
}
EOF
  if [ -n "$cpu" ]; then
    taskset -c "$cpu" "$nginx" -c "$dir/nginx/nginx.conf" -p "$dir/nginx" 2>"$dir/nginx/stderr" &
  else
    "$nginx" -c "$dir/nginx/nginx.conf" -p "$dir/nginx" 2>"$dir/nginx/stderr" &
  fi
  MOCK_PID=$!
  for _ in $(seq 100); do
    [ -s "$dir/nginx/nginx.pid" ] && break
    sleep 0.05
  done
  if [ ! -s "$dir/nginx/nginx.pid" ]; then
    echo "the nginx mock did not start ($nginx):" >&2
    cat "$dir/nginx/stderr" "$dir/nginx/error.log" >&2 2>/dev/null || true
    exit 1
  fi
  MOCK_WORKER=$(pgrep -P "$(cat "$dir/nginx/nginx.pid")" | head -1)
}
