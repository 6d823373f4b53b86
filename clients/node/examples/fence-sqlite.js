// Fencing a resource that is not Redis: a SQLite table that keeps, with each row, the
// fence of the last write, and takes a write only with a fence at least as new:
//
//   UPDATE documents SET body = ?, fence = ? WHERE id = ? AND fence <= ?
//
// The check and the write are one statement, so the database itself refuses a stale
// holder's write, whatever that holder believes about its lease. SQLite here is sql.js
// (SQLite compiled to WebAssembly: no native build; a devDependency of this package).
// On Node 22.5+ node:sqlite runs the same SQL (DatabaseSync, prepare(...).run(...).changes).
//
//   scripts/start && cd clients/node && npm install && npm run build
//   node examples/fence-sqlite.js           # REDIS_PORT=6380 for another port
'use strict';

const initSqlJs = require('sql.js');
const Redis = require('ioredis');
const { Leases, StaleFence } = require('redis-lease');

const PORT = Number(process.env.REDIS_PORT || 6379);
const LOCK = 'lock:doc:42';

/** Write `body` to document `id` if `lease` holds the newest fence the row has seen. */
function fencedWrite(db, lease, id, body) {
  db.run('UPDATE documents SET body = ?, fence = ? WHERE id = ? AND fence <= ?', [body, lease.fence, id, lease.fence]);
  if (db.getRowsModified() === 1) return;
  const [[highest]] = db.exec('SELECT fence FROM documents WHERE id = ?', [id])[0].values;
  throw new StaleFence(`documents/${id}`, lease.fence, highest, `fence ${lease.fence} is older than ${highest}`);
}

async function main() {
  const SQL = await initSqlJs();
  const db = new SQL.Database();
  db.run('CREATE TABLE documents (id INTEGER PRIMARY KEY, body TEXT NOT NULL, fence INTEGER NOT NULL DEFAULT 0)');
  db.run("INSERT INTO documents (id, body) VALUES (42, 'v0')");

  const redis = new Redis(PORT);
  const a = new Leases(redis);
  const b = new Leases(redis);
  try {
    // A holds the lease but stops renewing (as a paused process does), and its lease expires.
    const la = await a.acquire(LOCK, { ttlMs: 300, autoRenew: false, owner: 'writer-a' });
    fencedWrite(db, la, 42, 'v1 by A');
    console.log(`A (fence ${la.fence}) wrote v1`);
    const lb = await b.acquire(LOCK, { ttlMs: 5000, blockMs: 5000, owner: 'writer-b' });
    console.log(`B (fence ${lb.fence}) got the lease once A's expired; A's state: ${la.state}`);
    fencedWrite(db, lb, 42, 'v2 by B');
    console.log('B wrote v2');
    // A's write was already on its way: the database refuses it by itself.
    try {
      fencedWrite(db, la, 42, 'v1.1 by A');
      console.log('A wrote v1.1 (this must not happen)');
    } catch (err) {
      if (!(err instanceof StaleFence)) throw err;
      console.log(`A's late write refused: ${err.message}`);
    }
    await lb.release();
    const [[body, fence]] = db.exec('SELECT body, fence FROM documents WHERE id = 42')[0].values;
    console.log(`documents/42: ${JSON.stringify(body)} at fence ${fence}`);
    process.exitCode = body === 'v2 by B' ? 0 : 1;
  } finally {
    await a.close();
    await b.close();
    redis.disconnect();
    db.close();
  }
}

main().catch((err) => {
  console.error(err);
  process.exitCode = 1;
});
