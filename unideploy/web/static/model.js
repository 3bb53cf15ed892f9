// The body of the generated model.js: the site's module.py prepends the imports and the constants
// (SIGNATURE, VARIANTS, DEFAULT_VARIANT, BACKENDS) that it reads from the package.

/** A call with inputs the model cannot take: wrong names, array types, shapes or values. */
export class ModelInputError extends Error {
  constructor(message) {
    super(message);
    this.name = 'ModelInputError';
  }
}

const ARRAYS = {
  float32: Float32Array,
  float64: Float64Array,
  float16: Uint16Array, // or a Float16Array where the browser has one
  int8: Int8Array,
  uint8: Uint8Array,
  int16: Int16Array,
  uint16: Uint16Array,
  int32: Int32Array,
  uint32: Uint32Array,
  int64: BigInt64Array,
  uint64: BigUint64Array,
  bool: Uint8Array,
};
const ORT_TYPES = { bool: 'bool' }; // every other dtype keeps its name in ONNX Runtime Web

const shapeText = (shape) => `[${shape.map((d) => (d === null ? '?' : d)).join(', ')}]`;

function arrayMatches(dtype, data) {
  if (data instanceof ARRAYS[dtype]) return true;
  return dtype === 'float16' && typeof Float16Array !== 'undefined' && data instanceof Float16Array;
}

/** The shape of one input, checked against the signature: given, or inferred when one dim is open. */
function checkedShape(spec, data, given) {
  const expected = spec.shape;
  const size = (dims) => dims.reduce((a, b) => a * b, 1);
  if (given === undefined) {
    const open = expected.filter((d) => typeof d !== 'number');
    if (open.length > 1) {
      throw new ModelInputError(
        `input '${spec.name}' has ${open.length} dynamic dims (${shapeText(expected)}): ` +
          'pass {data, shape} instead of a bare array',
      );
    }
    const known = size(expected.filter((d) => typeof d === 'number'));
    const fits = open.length === 0 ? data.length === known : known > 0 && data.length % known === 0;
    if (!fits) {
      const needs = open.length === 0 ? `${known}` : `a multiple of ${known}`;
      throw new ModelInputError(`input '${spec.name}' holds ${data.length} values; ${shapeText(expected)} needs ${needs}`);
    }
    return expected.map((d) => (typeof d === 'number' ? d : data.length / known));
  }
  if (!Array.isArray(given) || given.some((d) => !Number.isInteger(d) || d < 0)) {
    throw new ModelInputError(`input '${spec.name}': shape must be an array of non-negative integers`);
  }
  if (given.length !== expected.length) {
    throw new ModelInputError(
      `input '${spec.name}' has rank ${given.length} (${shapeText(given)}); the model takes ` +
        `rank ${expected.length} ${shapeText(expected)}`,
    );
  }
  expected.forEach((d, axis) => {
    if (typeof d === 'number' && given[axis] !== d) {
      throw new ModelInputError(
        `input '${spec.name}' has shape ${shapeText(given)}; the model takes ${shapeText(expected)} ` +
          `(dim ${axis} must be ${d})`,
      );
    }
  });
  if (size(given) !== data.length) {
    throw new ModelInputError(
      `input '${spec.name}' holds ${data.length} values; shape ${shapeText(given)} needs ${size(given)}`,
    );
  }
  return given;
}

/** Values past the table an integer input is looked up in (the signature's table_rows: token ids),
 * refused naming the input, as deploy run and the server refuse them: ONNX Runtime's WebAssembly
 * Gather fails the run in its own words, and a GPU's Gather may answer zeros for them. */
function checkValues(spec, data) {
  const rows = spec.table_rows;
  if (!rows) return;
  const big = data instanceof BigInt64Array || data instanceof BigUint64Array;
  const [low, high] = big ? [BigInt(-rows), BigInt(rows)] : [-rows, rows];
  for (const value of data) {
    if (value < low || value >= high) {
      throw new ModelInputError(
        `input '${spec.name}' holds ${value}, past the ${rows} rows of the table the model looks it up in ` +
          `(it takes 0 to ${rows - 1}; ONNX counts -${rows} to -1 from the end)`,
      );
    }
  }
}

/** A streaming model's state at its start: each state input filled with its initial value, its
 * dynamic dims at 1 (one stream, one row). */
function initialState(carried) {
  const state = {};
  for (const pair of carried) {
    const spec = SIGNATURE.inputs.find((input) => input.name === pair.input);
    const shape = spec.shape.map((d) => (typeof d === 'number' ? d : 1));
    const data = new ARRAYS[spec.dtype](shape.reduce((a, b) => a * b, 1));
    data.fill(data instanceof BigInt64Array || data instanceof BigUint64Array ? BigInt(pair.initial) : pair.initial);
    state[pair.input] = { data, shape };
  }
  return state;
}

/** Why ``variant`` cannot run on ``backend`` in this browser, or null when it can. */
export async function unsupported(variant, backend) {
  const chosen = VARIANTS[variant];
  if (!chosen.backends.includes(backend)) return chosen.note || `meant for ${chosen.backends.join(', ')}`;
  const offered = await backendInfo(backend);
  if (!offered.ok) return offered.detail;
  if (backend === 'webgpu' && chosen.precision === 'fp16' && !offered.f16) {
    return "fp16 on WebGPU needs the adapter's shader-f16 feature, which this one lacks";
  }
  return null;
}

/** Whether this browser can run ``backend``, and what it would run on. */
export async function backendInfo(backend) {
  if (backend === 'wasm') {
    const cores = navigator.hardwareConcurrency;
    const threads = !self.crossOriginIsolated
      ? '1 (the page is not cross-origin isolated)'
      : ort.env.wasm.numThreads || `ONNX Runtime's default for ${cores} cores`;
    return { ok: true, detail: `WebAssembly, threads: ${threads}` };
  }
  if (backend === 'webgpu') {
    if (!navigator.gpu) return { ok: false, detail: 'this browser has no WebGPU (navigator.gpu)' };
    const adapter = await navigator.gpu.requestAdapter();
    if (!adapter) return { ok: false, detail: 'WebGPU offers no adapter here (no usable GPU)' };
    const info = adapter.info || {};
    const named = [info.vendor, info.architecture, info.description].filter(Boolean).join(' ');
    const f16 = adapter.features.has('shader-f16');
    return { ok: true, f16, detail: `WebGPU adapter: ${named || 'unnamed'} (${f16 ? '' : 'no '}shader-f16)` };
  }
  return { ok: false, detail: `unknown backend '${backend}'` };
}

export class Model {
  /**
   * Load one variant (default: fp32) on one backend (default: WebAssembly).
   * @param {{variant?: string, backend?: string, threads?: number}} options
   */
  static async load({ variant = DEFAULT_VARIANT, backend = 'wasm', threads } = {}) {
    const chosen = VARIANTS[variant];
    if (!chosen) {
      throw new ModelInputError(`unknown variant '${variant}': this site has ${Object.keys(VARIANTS).join(', ')}`);
    }
    if (!BACKENDS.includes(backend)) {
      throw new ModelInputError(`backend '${backend}' is not in this site's runtime build (${BACKENDS.join(', ')})`);
    }
    const why = await unsupported(variant, backend);
    if (why) throw new ModelInputError(`variant '${variant}' cannot run on ${backend} here: ${why}`);
    if (threads !== undefined) ort.env.wasm.numThreads = threads;
    const url = (path) => new URL(path, import.meta.url).href;
    const session = await ort.InferenceSession.create(url(chosen.file), {
      executionProviders: [backend],
      externalData: chosen.external_data.map((path) => ({ path: path.split('/').pop(), data: url(path) })),
    });
    return new Model(session, variant, backend);
  }

  constructor(session, variant, backend) {
    this.session = session;
    this.variant = variant;
    this.backend = backend;
    this.precision = VARIANTS[variant].precision;
    this.state = null; // a streaming model's state, carried between calls that leave it out
  }

  /** Start a streaming model's next call from its initial state again (a new stream). */
  reset() {
    this.state = null;
  }

  /**
   * Run the model. Each input is a typed array of its dtype (its shape inferred when only one dim
   * is dynamic) or {data, shape}. Returns {name: {data, shape, dtype}} for every output.
   * A streaming model (SIGNATURE.state) called without its state inputs carries them itself: the
   * first call starts from the recorded initial values (one row), each call's state outputs feed
   * the next, until reset().
   */
  async run(inputs) {
    const carried = SIGNATURE.state || [];
    const given = carried.filter((pair) => inputs[pair.input] !== undefined);
    if (given.length > 0 && given.length < carried.length) {
      const missing = carried.filter((pair) => inputs[pair.input] === undefined).map((pair) => pair.input);
      throw new ModelInputError(
        `state input(s) ${given.map((pair) => pair.input).join(', ')} given without ${missing.join(', ')}: ` +
          'give every state input, or none (the model then carries its state from call to call)',
      );
    }
    const streaming = carried.length > 0 && given.length === 0;
    if (streaming) inputs = { ...inputs, ...(this.state || initialState(carried)) };
    const outputs = await this.#runOnce(inputs);
    if (streaming) {
      this.state = Object.fromEntries(
        carried.map((pair) => [pair.input, { data: outputs[pair.output].data, shape: outputs[pair.output].shape }]),
      );
    }
    return outputs;
  }

  async #runOnce(inputs) {
    const feeds = {};
    const names = SIGNATURE.inputs.map((spec) => spec.name);
    for (const name of Object.keys(inputs)) {
      if (!names.includes(name)) {
        throw new ModelInputError(`unknown input '${name}': this model takes ${names.join(', ')}`);
      }
    }
    for (const spec of SIGNATURE.inputs) {
      const given = inputs[spec.name];
      if (given === undefined) {
        throw new ModelInputError(`missing input '${spec.name}' (${spec.dtype} ${shapeText(spec.shape)})`);
      }
      const data = ArrayBuffer.isView(given) ? given : given.data;
      if (!ArrayBuffer.isView(data) || !arrayMatches(spec.dtype, data)) {
        const got = data === undefined || data === null ? typeof data : data.constructor.name;
        throw new ModelInputError(
          `input '${spec.name}' must be a ${ARRAYS[spec.dtype].name} (${spec.dtype}); got ${got}`,
        );
      }
      const shape = checkedShape(spec, data, ArrayBuffer.isView(given) ? undefined : given.shape);
      checkValues(spec, data);
      feeds[spec.name] = new ort.Tensor(ORT_TYPES[spec.dtype] || spec.dtype, data, shape);
    }
    const results = await this.session.run(feeds);
    const outputs = {};
    for (const spec of SIGNATURE.outputs) {
      const tensor = results[spec.name];
      outputs[spec.name] = { data: tensor.data, shape: tensor.dims.slice(), dtype: spec.dtype };
    }
    return outputs;
  }

  async release() {
    await this.session.release();
  }
}
