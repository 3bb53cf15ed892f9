// The demo page: runs every reference sample on every model variant and backend, shows outputs,
// errors against the source framework's outputs and timing; for an image classifier, classifies a
// picked image. `deploy verify` drives the same functions (window.unideploy) from headless Chromium.
import { BACKENDS, Model, SIGNATURE, VARIANTS, backendInfo, unsupported } from './model.js';

const site = await (await fetch(new URL('web.json', import.meta.url))).json();
const ARRAYS = {
  float32: Float32Array, float64: Float64Array, float16: Uint16Array, int8: Int8Array, uint8: Uint8Array,
  int16: Int16Array, uint16: Uint16Array, int32: Int32Array, uint32: Uint32Array, int64: BigInt64Array,
  uint64: BigUint64Array, bool: Uint8Array,
};
const $ = (id) => document.getElementById(id);

/** One stored sample: {batch_size, inputs, outputs}, each tensor {data, shape, dtype}. */
async function loadSample(sample) {
  const bytes = await (await fetch(new URL(sample.file, import.meta.url))).arrayBuffer();
  const read = (tensors) =>
    Object.fromEntries(
      tensors.map((t) => {
        const Array_ = ARRAYS[t.dtype];
        const data = new Array_(bytes.slice(t.offset, t.offset + t.bytes));
        return [t.name, { data, shape: t.shape, dtype: t.dtype }];
      }),
    );
  return { batch_size: sample.batch_size, inputs: read(sample.inputs), outputs: read(sample.outputs) };
}

function base64(data) {
  const bytes = new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
  let text = '';
  for (let i = 0; i < bytes.length; i += 0x8000) text += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(text);
}

const median = (values) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)];

let stored; // the samples' tensors, fetched once
const samples = () => (stored ??= Promise.all(site.samples.map(loadSample)));

/**
 * Load ``variant`` on ``backend``, run every stored sample once, then time up to ``repeats`` runs
 * of the smallest sample: at least 3, and no more once ``budgetMs`` have gone (a software GPU takes
 * seconds per run). Returns {loadMs, results (one per sample), latencies, batch}.
 */
async function measure(variant, backend, repeats, budgetMs) {
  const all = await samples();
  const started = performance.now();
  const model = await Model.load({ variant, backend });
  const loadMs = performance.now() - started;
  try {
    const results = [];
    for (const sample of all) results.push(await model.run(sample.inputs));
    const smallest = all.reduce((a, b) => (b.batch_size < a.batch_size ? b : a));
    const latencies = [];
    const begun = performance.now();
    while (latencies.length < repeats && (latencies.length < 3 || performance.now() - begun < budgetMs)) {
      const t0 = performance.now();
      await model.run(smallest.inputs);
      latencies.push(performance.now() - t0);
    }
    return { loadMs, results, latencies, batch: smallest.batch_size };
  } finally {
    await model.release();
  }
}

/** What `deploy verify` judges: the outputs of every sample (raw bytes, base64) and the timing. */
async function check(variant, backend, repeats = 20, budgetMs = 10000) {
  const found = await measure(variant, backend, repeats, budgetMs);
  const encoded = (result) =>
    Object.fromEntries(
      Object.entries(result).map(([name, t]) => [name, { dtype: t.dtype, shape: t.shape, base64: base64(t.data) }]),
    );
  return {
    load_ms: found.loadMs,
    latency_ms: found.latencies,
    latency_batch: found.batch,
    outputs: found.results.map(encoded),
  };
}

/** Largest |actual - expected| and the values off by more than atol + rtol * |expected|, for the
 * page's table (deploy verify judges the outputs the page returns with the package's own code). */
function errors(actual, expected, atol, rtol) {
  let worst = 0;
  let off = 0;
  for (let i = 0; i < expected.data.length; i++) {
    const want = Number(expected.data[i]);
    const diff = Math.abs(Number(actual.data[i]) - want);
    worst = Math.max(worst, Number.isNaN(diff) ? Infinity : diff);
    if (!(diff <= atol + rtol * Math.abs(want))) off += 1;
  }
  return { worst, off };
}

/** The first values of each output of a result (its first row's argmax where it is a float vector). */
function preview(result) {
  return Object.entries(result)
    .map(([name, t]) => {
      const row = t.shape.length > 1 ? t.shape.slice(1).reduce((a, b) => a * b, 1) : t.data.length;
      const first = Array.from(t.data.slice(0, Math.min(row, 4)), (v) => (typeof v === 'number' ? v.toPrecision(4) : v));
      const floats = t.dtype.startsWith('float') && t.shape.length === 2 && row > 1;
      const best = floats ? ` argmax ${t.data.slice(0, row).reduce((b, v, i, a) => (v > a[b] ? i : b), 0)}` : '';
      return `${name}: [${first.join(', ')}${row > 4 ? ', …' : ''}]${best}`;
    })
    .join('; ');
}

function cell(row, text, cls) {
  const td = row.insertCell();
  td.textContent = text;
  if (cls) td.className = cls;
}

/** What a person sees on opening the page: every variant on every backend this browser offers. */
async function runPage() {
  const table = $('checks');
  const all = await samples();
  for (const backend of BACKENDS) {
    for (const entry of site.models) {
      const row = table.insertRow();
      cell(row, entry.artifact);
      cell(row, backend);
      const why = await unsupported(entry.artifact, backend);
      if (why) {
        cell(row, 'not run', 'skip');
        cell(row, why);
        continue;
      }
      try {
        const found = await measure(entry.artifact, backend, 10, 5000);
        let worst = 0;
        let off = 0;
        found.results.forEach((result, i) => {
          for (const [name, expected] of Object.entries(all[i].outputs)) {
            const compared = errors(result[name], expected, entry.atol, entry.rtol);
            worst = Math.max(worst, compared.worst);
            off += compared.off;
          }
        });
        const within = off === 0;
        cell(row, within ? 'within tolerance' : 'OFF', within ? 'ok' : 'bad');
        cell(
          row,
          `max abs error ${worst.toExponential(2)}, ${off} values off (atol ${entry.atol.toExponential(2)}, ` +
            `rtol ${entry.rtol}); ${preview(found.results[0])}; load ${found.loadMs.toFixed(0)} ms; ` +
            `batch ${found.batch}: ${median(found.latencies).toFixed(2)} ms`,
        );
      } catch (error) {
        cell(row, 'failed', 'bad');
        cell(row, String(error.message || error));
      }
    }
  }
}

/** An image classifier's picker: the image resized to the input, scaled as the hint says, top 5. */
async function classify(file) {
  const c = site.classifier;
  const bitmap = await createImageBitmap(file);
  const canvas = $('canvas');
  canvas.width = c.width;
  canvas.height = c.height;
  const context = canvas.getContext('2d');
  context.drawImage(bitmap, 0, 0, c.width, c.height);
  const pixels = context.getImageData(0, 0, c.width, c.height).data;
  const scale = site.preprocessing_hints[$('scale').value];
  const plane = c.width * c.height;
  const data = new Float32Array(plane * c.channels);
  for (let p = 0; p < plane; p++) {
    for (let ch = 0; ch < c.channels; ch++) {
      const value = c.channels === 1 ? (pixels[4 * p] + pixels[4 * p + 1] + pixels[4 * p + 2]) / 3 : pixels[4 * p + ch];
      const scaled = (value * scale.multiply - scale.mean[ch % scale.mean.length]) / scale.std[ch % scale.std.length];
      data[c.layout === 'NHWC' ? p * c.channels + ch : ch * plane + p] = scaled;
    }
  }
  const shape = c.layout === 'NHWC' ? [1, c.height, c.width, c.channels] : [1, c.channels, c.height, c.width];
  const model = await Model.load();
  const t0 = performance.now();
  const result = await model.run({ [c.input]: { data, shape } });
  const ms = performance.now() - t0;
  await model.release();
  const scores = Array.from(result[c.output].data);
  const top = scores.map((s, i) => [s, i]).sort((a, b) => b[0] - a[0]).slice(0, 5);
  const labels = site.labels ? (await (await fetch(new URL(site.labels, import.meta.url))).text()).split('\n') : [];
  $('top').textContent =
    top.map(([s, i]) => `${labels[i] || `class ${i}`}: ${s.toFixed(3)}`).join('\n') + `\n(${ms.toFixed(1)} ms)`;
}

function describe() {
  const tensors = (list) => list.map((t) => `${t.name}: ${t.dtype} [${t.shape.join(', ')}]`).join('; ');
  $('title').textContent = `${site.model.name} ${site.model.version}`;
  $('about').textContent =
    `From a ${site.model.framework} model, on ONNX Runtime Web ${site.runtime.version} ` +
    `(${BACKENDS.join(', ')}). Inputs: ${tensors(SIGNATURE.inputs)}. Outputs: ${tensors(SIGNATURE.outputs)}.`;
  if (site.classifier) {
    $('picker').hidden = false;
    for (const [name, hint] of Object.entries(site.preprocessing_hints)) {
      $('scale').add(new Option(hint.label, name, false, name === site.classifier.scale));
    }
    $('image').addEventListener('change', (event) => classify(event.target.files[0]));
  }
}

describe();
window.unideploy = { site, variants: Object.keys(VARIANTS), backendInfo, unsupported, check, runPage };
document.body.dataset.state = 'ready';
if (new URLSearchParams(location.search).get('auto') !== '0') {
  await runPage();
  document.body.dataset.state = 'done';
}
