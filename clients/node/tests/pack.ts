/**
 * The package as npm publishes it: `npm pack`, the tarball installed into a fresh
 * project (no TypeScript there, no install script run), and used against a real server.
 */
import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import { mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, it } from 'node:test';

import { FLAVORS, type Flavor, PACKAGE_ROOT, Server, serverBinary } from './harness';

const npm = (args: string[], cwd: string): string =>
  execFileSync('npm', [...args, '--no-audit', '--no-fund', '--loglevel=error'], { cwd, encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });

const USE = `
'use strict';
const Redis = require('ioredis');
const { Leases, LeaseLost, WriteIndeterminate } = require('redis-lease');
(async () => {
  const redis = new Redis({ port: Number(process.argv[2]) });
  const leases = new Leases(redis);
  try {
    const out = await leases.using('pack:lock', { ttlMs: 5000 }, async (lease) => {
      await lease.fenceCall('pack:fence', 'SET', 'pack:data', String(lease.fence));
      return [typeof LeaseLost, typeof WriteIndeterminate, lease.fence > 0, await redis.get('pack:data') === String(lease.fence)];
    });
    console.log(JSON.stringify(out));
  } finally {
    await leases.close();
    await redis.quit();
  }
})();
`;

export function definePack(flavor: Flavor): void {
  // Once per run: on the first server of the matrix that is set.
  const first = Object.keys(FLAVORS).find((f) => serverBinary(f));
  if (flavor !== first) return;
  describe(flavor, () => {
    it('npm pack: the tarball ships dist/ and LICENSE, has no install script, and works from a fresh project', async () => {
      const dir = mkdtempSync(join(tmpdir(), 'lease-node-pack-'));
      const server = await Server.start(flavor);
      try {
        npm(['pack', '--pack-destination', dir], PACKAGE_ROOT);
        const tarball = readdirSync(dir).find((f) => f.endsWith('.tgz'));
        assert.ok(tarball, 'npm pack made no tarball');
        const listing = execFileSync('tar', ['-tzf', join(dir, tarball)], { encoding: 'utf8' }).split('\n');
        for (const f of ['package/dist/index.js', 'package/dist/index.d.ts', 'package/LICENSE', 'package/README.md', 'package/package.json']) {
          assert.ok(listing.includes(f), `${f} missing from the tarball`);
        }
        assert.equal(listing.filter((f) => f.startsWith('package/tests/') || f.startsWith('package/build/')).length, 0);
        const manifest = JSON.parse(execFileSync('tar', ['-xzOf', join(dir, tarball), 'package/package.json'], { encoding: 'utf8' })) as {
          scripts?: Record<string, string>;
        };
        for (const hook of ['preinstall', 'install', 'postinstall']) assert.equal(manifest.scripts?.[hook], undefined, hook);

        const project = join(dir, 'app');
        execFileSync('mkdir', ['-p', project]);
        writeFileSync(join(project, 'package.json'), JSON.stringify({ name: 'app', private: true, version: '1.0.0' }));
        const ioredis = (require('ioredis/package.json') as { version: string }).version;
        npm(['install', join(dir, tarball), `ioredis@${ioredis}`], project);
        assert.equal(spawnSync(process.execPath, ['-e', "require.resolve('typescript')"], { cwd: project }).status, 1, 'typescript installed');
        writeFileSync(join(project, 'use.js'), USE);
        // Exits by itself: the example closes its Leases and its client.
        const run = spawnSync(process.execPath, ['use.js', String(server.port)], { cwd: project, encoding: 'utf8', timeout: 30_000 });
        assert.equal(run.status, 0, `${run.stdout}\n${run.stderr}`);
        assert.deepEqual(JSON.parse(run.stdout.trim()), ['function', 'function', true, true]);
      } finally {
        await server.stop();
        rmSync(dir, { recursive: true, force: true });
      }
    });
  });
}
