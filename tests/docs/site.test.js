'use strict';
// The documentation site in Debian's headless Chromium (make test-docs, after
// make docs): the front page and one guide show their headings, their code
// and the theme's styles, with no console error and no failed request; the
// screenshots are left in target/docs-shots/.

const { describe, it, before, after } = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { pathToFileURL } = require('node:url');
const puppeteer = require('puppeteer-core');

const ROOT = path.resolve(__dirname, '../..');
const SITE = path.join(ROOT, 'target', 'site');
const SHOTS = path.join(ROOT, 'target', 'docs-shots');
const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';

async function open(browser, rel, shot) {
  const page = await browser.newPage();
  await page.setViewport({ width: 1280, height: 1000 });
  const errors = [];
  page.on('requestfailed', (r) => {
    // The theme may ask for a web font; the site works without it.
    if (r.url().startsWith('file:')) errors.push(`request failed: ${r.url()}`);
  });
  page.on('console', (m) => { if (m.type() === 'error') errors.push(`console: ${m.text()}`); });
  page.on('pageerror', (e) => errors.push(`page error: ${e.message}`));
  const response = await page.goto(pathToFileURL(path.join(SITE, rel)).href, { waitUntil: 'load' });
  assert.ok(response.ok(), `${rel} loads`);
  const shown = await page.evaluate(() => {
    const visible = (el) => { const r = el.getBoundingClientRect(); return r.width > 0 && r.height > 0; };
    const h1 = [...document.querySelectorAll('article h1')].filter(visible).map((h) => h.textContent.trim());
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
  await page.close();
  assert.deepEqual(errors, [], `${rel}: no console error, no failed request`);
  return shown;
}

describe('the documentation site', () => {
  let browser;
  before(async () => {
    assert.ok(fs.existsSync(path.join(SITE, 'index.html')), 'target/site is built (make docs)');
    browser = await puppeteer.launch({ executablePath: CHROMIUM, headless: true,
      args: ['--no-sandbox', '--disable-gpu', '--allow-file-access-from-files'] });
  });
  after(async () => { if (browser) await browser.close(); });

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

  it('the algorithms page draws a picture per algorithm', async () => {
    const s = await open(browser, 'concepts/algorithms.html', 'algorithms.png');
    assert.equal(s.svgs, 4);
  });
});
