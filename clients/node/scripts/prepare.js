// `prepare`: compile src/ to dist/ with the TypeScript this package pins.
//
// `npm install ./clients/node` links the folder and runs this in it without installing
// the folder's devDependencies, so on a fresh checkout there is no tsc yet: then the
// locked devDependencies are installed here first (npm ci), and the build runs.
'use strict';

const { execFileSync } = require('node:child_process');
const { join } = require('node:path');

const root = join(__dirname, '..');

function tscPath() {
  try {
    return require.resolve('typescript/bin/tsc', { paths: [root] });
  } catch {
    return undefined;
  }
}

let tsc = tscPath();
if (!tsc) {
  const npm = process.env.npm_execpath;
  const args = ['ci', '--include=dev', '--ignore-scripts', '--no-audit', '--no-fund'];
  if (npm && npm.endsWith('.js')) execFileSync(process.execPath, [npm, ...args], { cwd: root, stdio: 'inherit' });
  else execFileSync('npm', args, { cwd: root, stdio: 'inherit' });
  tsc = tscPath();
  if (!tsc) throw new Error('redis-lease: typescript is still missing after npm ci');
}
execFileSync(process.execPath, [tsc, '-p', join(root, 'tsconfig.json')], { cwd: root, stdio: 'inherit' });
