'use strict';
// The documentation site in Debian's headless Chromium (make test-docs, after
// make docs), served over HTTP from target/site on a free loopback port as any
// static host serves it: the front page and one guide show their headings,
// their code and the theme's styles, with no console error and no failed
// request; the screenshots are left in target/docs-shots/.

const { describe, it, before, after } = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const http = require('node:http');
const puppeteer = require('puppeteer-core');

const ROOT = path.resolve(__dirname, '../..');
const SITE = path.join(ROOT, 'target', 'site');
const SHOTS = path.join(ROOT, 'target', 'docs-shots');
const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';

const TYPES = { '.html': 'text/html', '.js': 'text/javascript', '.css': 'text/css', '.json': 'application/json',
  '.svg': 'image/svg+xml', '.png': 'image/png', '.woff2': 'font/woff2', '.toml': 'text/plain' };

/** A static server of target/site on 127.0.0.1 (port chosen by the system). */
function serve() {
  const server = http.createServer((req, res) => {
    const rel = decodeURIComponent(new URL(req.url, 'http://x').pathname).replace(/\/$/, '/index.html');
    const file = path.join(SITE, path.normalize(rel));
    if (!file.startsWith(SITE) || !fs.existsSync(file) || !fs.statSync(file).isFile()) {
      res.writeHead(404); res.end(); return;
    }
    res.writeHead(200, { 'Content-Type': TYPES[path.extname(file)] || 'application/octet-stream' });
    fs.createReadStream(file).pipe(res);
  });
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve(server)));
}

let base;

async function open(browser, rel, shot) {
  const page = await browser.newPage();
  await page.setViewport({ width: 1280, height: 1000 });
  const errors = [];
  page.on('requestfailed', (r) => {
    errors.push(`request failed: ${r.url()}`);
  });
  page.on('console', (m) => { if (m.type() === 'error') errors.push(`console: ${m.text()}`); });
  page.on('request', (r) => { if (!r.url().startsWith(base) && !r.url().startsWith('data:')) errors.push(`a request off the site: ${r.url()}`); });
  page.on('pageerror', (e) => errors.push(`page error: ${e.message}`));
  const response = await page.goto(`${base}/${rel}`, { waitUntil: 'networkidle0' });
  assert.ok(response.ok(), `${rel} loads`);
  const shown = await page.evaluate(() => {
    const visible = (el) => { const r = el.getBoundingClientRect(); return r.width > 0 && r.height > 0; };
    const h1 = [...document.querySelectorAll('article h1')].filter(visible).map((h) => h.textContent.replace('¶', '').trim());
    const h2 = [...document.querySelectorAll('article h2')].filter(visible).map((h) => h.textContent.replace('¶', '').trim());
    const code = [...document.querySelectorAll('article pre code')].filter(visible);
    const highlighted = document.querySelectorAll('article pre code span').length;
    const font = getComputedStyle(document.querySelector('article')).fontFamily;
    const header = document.querySelector('header.md-header');
    return { h1, h2, code: code.map((c) => c.textContent), highlighted, font,
      headerHeight: header ? header.getBoundingClientRect().height : 0,
      svgs: [...document.querySelectorAll('article svg.tg-chart')].filter(visible).length };
  });
  fs.mkdirSync(SHOTS, { recursive: true });
  await page.screenshot({ path: path.join(SHOTS, shot), fullPage: false });
  const chart = await page.$('article svg.tg-chart');
  if (chart) await chart.screenshot({ path: path.join(SHOTS, shot.replace('.png', '-chart.png')) });
  await page.close();
  assert.deepEqual(errors, [], `${rel}: no console error, no failed request`);
  return shown;
}

describe('the documentation site', () => {
  let browser;
  let server;
  before(async () => {
    server = await serve();
    base = `http://127.0.0.1:${server.address().port}`;
    assert.ok(fs.existsSync(path.join(SITE, 'index.html')), 'target/site is built (make docs)');
    browser = await puppeteer.launch({ executablePath: CHROMIUM, headless: true,
      args: ['--no-sandbox', '--disable-gpu', '--allow-file-access-from-files'] });
  });
  after(async () => {
    if (browser) await browser.close();
    if (server) server.close();
  });

  it('the front page shows its title, sections and the theme', async () => {
    const s = await open(browser, 'index.html', 'index.png');
    assert.deepEqual(s.h1, ['throttlegate']);
    assert.ok(s.h2.includes('Where to start'), `h2: ${s.h2}`);
    assert.ok(s.headerHeight > 30, 'the theme\'s header is drawn');
    assert.ok(!/Times/.test(s.font), `a styled font, not the browser default: ${s.font}`);
  });

  it('the Flask guide shows its program, highlighted', async () => {
    const s = await open(browser, 'getting-started/flask.html', 'flask.png');
    assert.deepEqual(s.h1, ['Flask']);
    assert.ok(s.code.some((c) => c.includes('from throttlegate.flask import Throttle')), 'the program is shown');
    assert.ok(s.highlighted > 20, `the code is highlighted (${s.highlighted} spans)`);
  });

  it('the Rust API reference (rustdoc) is part of the site', async () => {
    const page = await browser.newPage();
    const response = await page.goto(`${base}/api/rust/throttlegate/index.html`, { waitUntil: 'load' });
    assert.ok(response.ok());
    const title = await page.evaluate(() => document.querySelector('h1').textContent);
    assert.match(title, /throttlegate/);
    await page.close();
  });

  it('the algorithms page draws a picture per algorithm', async () => {
    const s = await open(browser, 'concepts/algorithms.html', 'algorithms.png');
    assert.equal(s.svgs, 4);
  });
});
