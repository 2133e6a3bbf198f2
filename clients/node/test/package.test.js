'use strict';
// The helper as a package: its exports map, its TypeScript declarations
// (compiled with tsc against a usage file), and every export declared.
const { it } = require('node:test');
const assert = require('node:assert/strict');
const { execFileSync } = require('node:child_process');
const fs = require('node:fs');
const path = require('node:path');

const dir = path.join(__dirname, '..');
const run = (args, opts = {}) => execFileSync(process.execPath, args, { cwd: dir, encoding: 'utf8', ...opts });

it('resolves by its name through exports, and only what it exports', () => {
  // a package may require itself by name: the exports map decides
  const out = run(['-e', `const i = require('idem-client'); console.log(require.resolve('idem-client'),
    typeof i.execute, typeof i.Workflow);
    try { require('idem-client/test/cluster.js'); } catch (e) { console.log(e.code); }`]);
  const [file, execute, , code] = out.split(/\s+/);
  assert.equal(file, path.join(dir, 'idem.js'));
  assert.equal(execute, 'function');
  assert.equal(code, 'ERR_PACKAGE_PATH_NOT_EXPORTED');
  // and from an ES module, with named imports
  const esm = run(['--input-type=module', '-e',
    "import { execute, KeyReused } from 'idem-client'; console.log(typeof execute, KeyReused.sqlstate)"]);
  assert.equal(esm.trim(), 'function ID422');
});

it('declares every export in idem.d.ts', () => {
  const dts = fs.readFileSync(path.join(dir, 'idem.d.ts'), 'utf8');
  const declared = new Set([...dts.matchAll(/^export (?:declare )?(?:function|class|const) (\w+)/gm)].map((m) => m[1]));
  const missing = Object.keys(require('../idem.js')).filter((k) => !declared.has(k));
  assert.deepEqual(missing, []);
  const pkg = JSON.parse(fs.readFileSync(path.join(dir, 'package.json'), 'utf8'));
  assert.equal(pkg.exports['.'].types, './idem.d.ts');
  assert.ok(pkg.files.includes('idem.d.ts') && pkg.files.includes('idem.js'));
});

it('type-checks a usage file against the declarations (tsc --strict)', () => {
  const tsc = path.join(dir, 'node_modules', 'typescript', 'bin', 'tsc');
  assert.ok(fs.existsSync(tsc), 'typescript (a devDependency): run npm ci');
  // its @ts-expect-error lines are wrong uses: tsc fails if one compiles
  run([tsc, '--noEmit', '--strict', '--module', 'node16', '--moduleResolution', 'node16',
    path.join('test', 'types', 'usage.ts')]);
});
