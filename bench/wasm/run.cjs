// Times the core's fingerprint in WASM under Node (the wasm-bindgen `nodejs` build of
// idem-bench-wasm). Prints one JSON array; idem-bench reads it and compares with native.
//   node run.cjs <path to idem_bench_wasm.js> <milliseconds per case>
'use strict';
const idem = require(require('path').resolve(process.argv[2]));
const budgetMs = Number(process.argv[3] || 1000);
const sizes = [['1KiB', 1024], ['64KiB', 64 * 1024], ['1MiB', 1024 * 1024]];
const results = [];
for (const json of [false, true]) {
  for (const [label, size] of sizes) {
    const body = idem.makeBody(json, size);
    const run = (ms) => {
      const t0 = performance.now();
      let n = 0;
      while (performance.now() - t0 < ms) {
        idem.fingerprint(json, body);
        n++;
      }
      return [n, (performance.now() - t0) / 1000];
    };
    run(budgetMs / 4); // warm-up: let the engine tier the code up
    const [n, secs] = run(budgetMs);
    results.push({
      kind: json ? 'json' : 'raw',
      size: label,
      bytes: body.length,
      bytes_per_s: (body.length * n) / secs,
      fingerprint: Buffer.from(idem.fingerprint(json, body)).toString('hex'),
    });
  }
}
process.stdout.write(JSON.stringify(results) + '\n');
