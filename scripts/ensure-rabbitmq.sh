#!/usr/bin/env bash
# Makes a RabbitMQ server answer on 127.0.0.1:5672 for idemamqp's tests, when
# none is configured (the Kafka and NATS adapters' tests run their brokers in
# process, kfake and an embedded nats-server, and need nothing here):
#   - IDEM_TEST_AMQP_URL set: nothing to do;
#   - a server answers on 127.0.0.1:5672: nothing to do;
#   - Debian's rabbitmq-server is installed but down: start it;
#   - none is installed and we are root with apt-get: install it and start it
#     (its guest user may connect from localhost, which is all the tests do);
#   - otherwise: say so and fail, since the tests would fail anyway.
set -euo pipefail

say() { printf 'ensure-rabbitmq: %s\n' "$*" >&2; }

if [ -n "${IDEM_TEST_AMQP_URL:-}" ]; then
  say "using IDEM_TEST_AMQP_URL"
  exit 0
fi

answers() { (exec 3<>/dev/tcp/127.0.0.1/5672) 2>/dev/null; }

if answers; then
  exit 0
fi

start() {
  say "starting rabbitmq-server"
  # Without systemd (a container), the service script or the server itself.
  service rabbitmq-server start >/dev/null 2>&1 || (rabbitmq-server -detached >/dev/null 2>&1 || true)
  for _ in $(seq 1 60); do answers && return 0; sleep 1; done
  return 1
}

if ! command -v rabbitmq-server >/dev/null 2>&1; then
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    say "no RabbitMQ on 127.0.0.1:5672 and cannot install one (not root, or no apt-get);"
    say "set IDEM_TEST_AMQP_URL to a RabbitMQ the tests may use"
    exit 1
  fi
  say "installing rabbitmq-server with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq rabbitmq-server >/dev/null
fi

answers || start || { say "rabbitmq-server did not start; see /var/log/rabbitmq/"; exit 1; }
