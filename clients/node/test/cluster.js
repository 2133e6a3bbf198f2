'use strict';
// A throwaway PostgreSQL cluster with idem installed and preloaded (Unix
// socket and loopback TCP) and a PgBouncer in transaction mode in front of
// it, for the tests; start({ preload: false, pooler: false }) makes one
// without either.  Run as the cluster user (initdb refuses root); PG_CONFIG
// names the installation.
const { execFileSync, spawn } = require('node:child_process');
const fs = require('node:fs');
const net = require('node:net');
const os = require('node:os');
const path = require('node:path');
const pg = require('pg');

const PG_CONFIG = process.env.PG_CONFIG || '/usr/lib/postgresql/15/bin/pg_config';
const BINDIR = execFileSync(PG_CONFIG, ['--bindir'], { encoding: 'utf8' }).trim();
const PGBOUNCER = fs.existsSync('/usr/sbin/pgbouncer') ? '/usr/sbin/pgbouncer' : 'pgbouncer';
const DB = 'idemtest';

function freePort() {
  return new Promise((resolve) => {
    const s = net.createServer().listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

async function waitFor(config) {
  for (let i = 0; ; i++) {
    const c = new pg.Client(config);
    try {
      await c.connect();
      await c.end();
      return;
    } catch (e) {
      if (i > 100) throw e;
      await new Promise((r) => setTimeout(r, 100));
    }
  }
}

async function start({ preload = true, pooler = true } = {}) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'idem-nodetest.'));
  const data = path.join(dir, 'data');
  const port = await freePort();
  // the encoding and locale stated: without LANG initdb makes SQL_ASCII
  execFileSync(path.join(BINDIR, 'initdb'),
    ['-D', data, '-A', 'trust', '-U', 'postgres', '--encoding=UTF8', '--no-locale'], { stdio: 'ignore' });
  fs.appendFileSync(path.join(data, 'postgresql.conf'),
    `listen_addresses = '127.0.0.1'\nport = ${port}\nunix_socket_directories = '${dir}'\n` +
    // the tests watch events' states after their ack, and consumers woken
    // by their producers' NOTIFY
    'idem.outbox_keep_delivered = on\nidem.outbox_notify = on\n' +
    (preload ? "shared_preload_libraries = 'idem'\n" : ''));
  execFileSync(path.join(BINDIR, 'pg_ctl'), ['-D', data, '-w', '-l', path.join(dir, 'log'), 'start'], { stdio: 'ignore' });
  const direct = { host: dir, port, user: 'postgres', database: DB };
  const admin0 = new pg.Client({ ...direct, database: 'postgres' });
  await admin0.connect();
  await admin0.query(`CREATE DATABASE ${DB}`);
  await admin0.end();
  const admin = new pg.Client(direct);
  await admin.connect();
  await admin.query('CREATE EXTENSION idem');
  // publishing needs a registered topic (see the README's Outbox)
  await admin.query("SELECT idem_outbox_create_topic('refunds')");
  const stopServer = async () => {
    await admin.end();
    execFileSync(path.join(BINDIR, 'pg_ctl'), ['-D', data, '-m', 'immediate', 'stop'], { stdio: 'ignore' });
    fs.rmSync(dir, { recursive: true, force: true });
  };
  const log = path.join(dir, 'log'); // the server's log
  if (!pooler) return { admin, targets: { direct }, log, stop: stopServer };

  const bport = await freePort();
  const users = path.join(dir, 'users.txt');
  fs.writeFileSync(users, '"postgres" ""\n');
  const server = `host=${dir} port=${port} dbname=${DB}`;
  const ini = path.join(dir, 'pgbouncer.ini');
  fs.writeFileSync(ini, `[databases]
${DB} = ${server} pool_size=4
idemone = ${server} pool_size=1
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = ${bport}
unix_socket_dir =
auth_type = trust
auth_file = ${users}
pool_mode = transaction
logfile = ${dir}/pgbouncer.log
pidfile =
`);
  const bouncer = spawn(PGBOUNCER, [ini], { stdio: 'ignore' });
  const pooled = { host: '127.0.0.1', port: bport, user: 'postgres', database: DB };
  await waitFor(pooled);

  return {
    admin,
    log,
    targets: { direct, pgbouncer: pooled },
    pooledOne: { ...pooled, database: 'idemone' },
    async stop() {
      bouncer.kill('SIGTERM');
      await stopServer();
    },
  };
}

module.exports = { start };
