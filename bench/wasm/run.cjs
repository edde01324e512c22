// Times the core's fingerprint in WASM under Node (the wasm-bindgen `nodejs` build of
// idem-bench-wasm): SHA-256 in WASM (what the edge does), and the message made in WASM
// with SHA-256 by the runtime's WebCrypto (the alternative, measured). Prints one JSON
// array; idem-bench reads it and compares with native.
//   node run.cjs <path to idem_bench_wasm.js> <milliseconds per case>
'use strict';
const idem = require(require('path').resolve(process.argv[2]));
const budgetMs = Number(process.argv[3] || 1000);
const sizes = [['1KiB', 1024], ['64KiB', 64 * 1024], ['1MiB', 1024 * 1024]];
const results = [];
(async () => {
  for (const json of [false, true]) {
    for (const [label, size] of sizes) {
      const body = idem.makeBody(json, size);
      const time = async (ms, once) => {
        const t0 = performance.now();
        let n = 0;
        while (performance.now() - t0 < ms) {
          await once();
          n++;
        }
        return (body.length * n) / ((performance.now() - t0) / 1000);
      };
      const inWasm = () => idem.fingerprint(json, body);
      const webCrypto = () => crypto.subtle.digest('SHA-256', idem.fingerprintMessage(json, body));
      // Warm-ups let the engine tier the code up.
      await time(budgetMs / 4, inWasm);
      const wasmRate = await time(budgetMs, inWasm);
      await time(budgetMs / 4, webCrypto);
      const webCryptoRate = await time(budgetMs, webCrypto);
      const hex = (b) => Buffer.from(b).toString('hex');
      const fp = hex(idem.fingerprint(json, body));
      if (hex(await webCrypto()) !== fp) throw new Error(`WebCrypto digest differs for ${label}`);
      results.push({
        kind: json ? 'json' : 'raw',
        size: label,
        bytes: body.length,
        bytes_per_s: wasmRate,
        webcrypto_bytes_per_s: webCryptoRate,
        fingerprint: fp,
      });
    }
  }
  process.stdout.write(JSON.stringify(results) + '\n');
})().catch((e) => {
  console.error(e);
  process.exit(1);
});
