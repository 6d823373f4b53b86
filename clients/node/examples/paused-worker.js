// The seed scenario: a worker paused past its lease cannot damage the resource.
//
// Worker A (a child process) holds lock:report and appends its steps to the list
// `report`, each write fenced through LEASE.FENCE. Half way, A is stopped (SIGSTOP: what
// a long GC pause, a stalled VM or a swapped-out process look like from outside) for
// three times its ttl. Its watchdog cannot renew; the lease expires; worker B, waiting
// with BLOCK, gets it, writes the report and releases. Then A is resumed and goes on
// where it stopped. Its next write is refused twice over: its lease reads as lost at
// once (LeaseLost, the write is never sent), and a write sent anyway with A's fence
// is refused by the resource itself (STALE), because B has written with a newer one.
//
//   scripts/start               # a server with the module on 127.0.0.1:6379
//   cd clients/node && npm install && npm run build
//   node examples/paused-worker.js          # REDIS_PORT=6380 for another port
'use strict';

const { fork } = require('node:child_process');
const Redis = require('ioredis');
const { Leases, LeaseLost } = require('redis-lease');

const PORT = Number(process.env.REDIS_PORT || 6379);
const LOCK = 'lock:report';
const RESOURCE = 'fence:report';
const TTL = 1000;
// One clock for both processes' log lines.
const t0 = Number(process.env.EXAMPLE_T0 || Date.now());
process.env.EXAMPLE_T0 = String(t0);
const log = (who, msg) => console.log(`${String(Date.now() - t0).padStart(5)} ms  ${who}  ${msg}`);

async function workerA() {
  const redis = new Redis(PORT);
  const leases = new Leases(redis);
  try {
    await leases.using(LOCK, { ttlMs: TTL, owner: 'worker-a' }, async (lease, signal) => {
      log('A', `holds ${LOCK}, fence ${lease.fence}`);
      signal.addEventListener('abort', () => log('A', `signal: ${signal.reason.why}`));
      for (let step = 1; step <= 4; step++) {
        if (step === 3) {
          process.send({ paused: true, fence: lease.fence });
          // The parent stops this process here; everything below runs after SIGCONT.
          await new Promise((r) => process.once('message', r));
        }
        try {
          await lease.fenceCall(RESOURCE, 'RPUSH', 'report', `A step ${step}`);
          log('A', `wrote step ${step}`);
        } catch (err) {
          log('A', `step ${step} refused before sending: ${err.name} (${err.why ?? err.message})`);
          // A client without the local check would have sent it; the resource says no too.
          try {
            await redis.call('LEASE.FENCE', RESOURCE, lease.fence, 'RPUSH', 'report', `A step ${step}`);
            log('A', `step ${step} written anyway (this must not happen)`);
          } catch (e) {
            log('A', `step ${step} sent anyway with fence ${lease.fence}: ${e.message}`);
          }
          throw err;
        }
        await new Promise((r) => setTimeout(r, 100));
      }
    });
    log('A', 'finished (this must not happen)');
  } catch (err) {
    log('A', `using() ended with ${err.name}${err instanceof LeaseLost ? ': the work is abandoned' : ''}`);
  } finally {
    await leases.close();
    redis.disconnect();
  }
}

async function main() {
  const redis = new Redis(PORT);
  await redis.del('report');
  const a = fork(__filename, ['worker-a']);
  const paused = await new Promise((r) => a.once('message', r));

  a.kill('SIGSTOP');
  log('--', `worker A (pid ${a.pid}) stopped for ${3 * TTL} ms, past its ${TTL} ms lease`);
  const leases = new Leases(redis);
  const waited = leases.using(LOCK, { ttlMs: TTL, blockMs: 10_000, owner: 'worker-b' }, async (lease) => {
    log('B', `got ${LOCK} when A's lease expired, fence ${lease.fence} > ${paused.fence}`);
    for (const step of [1, 2, 3, 4]) await lease.fenceCall(RESOURCE, 'RPUSH', 'report', `B step ${step}`);
    log('B', 'wrote its report and releases');
  });
  await new Promise((r) => setTimeout(r, 3 * TTL));
  await waited;
  a.kill('SIGCONT');
  log('--', 'worker A resumed');
  a.send('go on');
  await new Promise((r) => a.once('exit', r));

  const report = await redis.lrange('report', 0, -1);
  console.log(`\nreport: ${JSON.stringify(report)}`);
  const damaged = report.slice(2).some((line) => line.startsWith('A'));
  console.log(damaged ? 'DAMAGED: a stale write got through' : 'intact: nothing A sent after its lease expired was written');
  await leases.close();
  redis.disconnect();
  process.exitCode = damaged ? 1 : 0;
}

(process.argv[2] === 'worker-a' ? workerA() : main()).catch((err) => {
  console.error(err);
  process.exitCode = 1;
});
