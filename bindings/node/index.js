// The native addon, built from source by `npm install` (see build.js).
'use strict';

let native;
try {
  native = require('./throttlegate.node');
} catch (err) {
  const e = new Error(
    'throttlegate: the native addon is missing or cannot be loaded; ' +
      'run `npm rebuild throttlegate` (building needs a Rust toolchain): ' + err.message,
  );
  e.code = 'internal';
  e.cause = err;
  throw e;
}

module.exports = native;
