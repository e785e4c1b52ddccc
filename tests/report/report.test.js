// `throttlegate simulate --report` in a real headless browser: Debian's
// Chromium, driven over the DevTools protocol by puppeteer-core (which brings
// no browser of its own). The page must load with no console error and no
// request but its own file, draw the charts the run calls for with the
// expected series, legends and points, and leave screenshots in
// target/report/ for people to look at.
//
// Needs the CLI binary (target/debug/throttlegate, or THROTTLEGATE_CLI) and
// Chromium (/usr/bin/chromium, or CHROMIUM); scripts/test-node.sh brings both.
'use strict';

const { describe, it, before, after } = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { execFileSync } = require('node:child_process');
const { pathToFileURL } = require('node:url');
const puppeteer = require('puppeteer-core');

const ROOT = path.resolve(__dirname, '../..');
const TARGET = process.env.CARGO_TARGET_DIR || path.join(ROOT, 'target');
const CLI = process.env.THROTTLEGATE_CLI || path.join(TARGET, 'debug', 'throttlegate');
const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
const OUT = path.join(TARGET, 'report');

/** Run the simulation, write the page, return the run's JSON. */
function simulate(page, extra) {
  // Paths relative to the checkout, as the page shows them.
  const args = ['simulate', '--rules', 'examples/rules.toml', '--json', '--report', page, ...extra];
  return JSON.parse(execFileSync(CLI, args, { cwd: ROOT, encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] }));
}

/** The charts one side of the page should have: [chart, series, points per series]. */
function expectedCharts(run) {
  const n = run.intervals.length;
  const charts = [['total', ['allowed', 'denied'], n]];
  const shadows = run.rules.filter((r) => r.shadow).map((r) => r.rule);
  if (shadows.length > 0) charts.push(['shadow', shadows, n]);
  if (run.most_denied_clients.length > 0) charts.push(['clients', ['allowed', 'denied'], run.most_denied_clients.length]);
  for (const r of run.rules) {
    charts.push([`rule:${r.rule}`, ['allowed', r.shadow ? 'would deny' : 'denied'], n]);
  }
  return charts;
}

/** Load `file` and report what was requested, logged and drawn. */
async function open(browser, file, width) {
  const page = await browser.newPage();
  await page.setViewport({ width, height: 900 });
  const requests = [];
  const errors = [];
  page.on('request', (r) => requests.push(r.url()));
  page.on('requestfailed', (r) => errors.push(`request failed: ${r.url()}`));
  page.on('console', (m) => {
    if (m.type() === 'error' || m.type() === 'warn') errors.push(`console ${m.type()}: ${m.text()}`);
  });
  page.on('pageerror', (e) => errors.push(`page error: ${e.message}`));
  const url = pathToFileURL(file).href;
  const response = await page.goto(url, { waitUntil: 'networkidle0' });
  assert.ok(response.ok(), `${url} loads`);
  const drawn = await page.evaluate(() => {
    // One cell per policy in every row of the page.
    const policies = [...new Set([...document.querySelectorAll('.cell[data-policy]')].map((c) => c.dataset.policy))];
    return policies.map((policy) => ({
      policy,
      charts: [...document.querySelectorAll('.cell[data-policy]')]
        .filter((cell) => cell.dataset.policy === policy)
        .flatMap((cell) => [...cell.querySelectorAll('svg[data-chart]')])
        .map((svg) => {
        const box = svg.getBoundingClientRect();
        const legend = svg.nextElementSibling;
        return {
          chart: svg.dataset.chart,
          width: box.width,
          height: box.height,
          series: [...svg.querySelectorAll('[data-series]')].map((g) => ({
            name: g.dataset.series,
            points: g.querySelectorAll(':scope > rect, :scope > g').length,
          })),
          legend: legend && legend.matches('ul.legend') ? [...legend.querySelectorAll('li')].map((li) => li.textContent) : [],
          text: [...svg.querySelectorAll('text')].map((t) => t.textContent),
        };
      }),
    }));
  });
  return { page, url, requests, errors, drawn };
}

function checkSide(side, run) {
  const expected = expectedCharts(run);
  assert.deepEqual(
    side.charts.map((c) => c.chart),
    expected.map(([chart]) => chart),
    `${side.policy}: the charts`,
  );
  for (const [chart, series, points] of expected) {
    const c = side.charts.find((x) => x.chart === chart);
    assert.ok(c.width > 200 && c.height > 80, `${chart} is drawn (${c.width}x${c.height})`);
    assert.deepEqual(c.series.map((s) => s.name), series, `${side.policy} ${chart}: the series`);
    if (chart !== 'shadow' || points <= 40) {
      for (const s of c.series) assert.equal(s.points, points, `${chart} ${s.name}: one mark per point`);
    }
    assert.equal(c.legend.length, series.length, `${chart}: one legend entry per series`);
    if (chart !== 'clients') {
      assert.ok(c.text.some((t) => t.startsWith('requests per ')), `${chart}: y axis with its unit`);
      assert.ok(c.text.some((t) => t.startsWith('virtual time')), `${chart}: x axis with its unit`);
    } else {
      assert.ok(c.text.some((t) => t.startsWith('requests over the whole run')), 'clients: x axis');
    }
  }
}

describe('simulate --report in Chromium', () => {
  let browser;
  before(async () => {
    assert.ok(fs.existsSync(CLI), `the CLI binary ${CLI} (cargo build -p throttlegate-cli)`);
    assert.ok(fs.existsSync(CHROMIUM), `Chromium at ${CHROMIUM} (apt-get install chromium)`);
    fs.mkdirSync(OUT, { recursive: true });
    browser = await puppeteer.launch({
      executablePath: CHROMIUM,
      headless: true,
      // Root on CI has no user namespaces for Chromium's sandbox.
      args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'],
    });
  });
  after(async () => {
    if (browser) await browser.close();
  });

  it('one policy: every chart, series and legend, nothing fetched, nothing logged', async () => {
    const file = path.join(OUT, 'report.html');
    const run = simulate(file, ['--scenario', 'examples/scenario-login-attack.toml']);
    const { page, url, requests, errors, drawn } = await open(browser, file, 900);
    assert.deepEqual(errors, []);
    assert.deepEqual(requests, [url], 'no request but the page itself');
    assert.equal(drawn.length, 1);
    checkSide(drawn[0], run);
    await page.screenshot({ path: path.join(OUT, 'report.png'), fullPage: true });
    await page.close();
  });

  it('--compare: both policies side by side on the same traffic', async () => {
    const file = path.join(OUT, 'compare.html');
    const run = simulate(file, ['--compare', 'examples/rules-enforced.toml']);
    const { page, url, requests, errors, drawn } = await open(browser, file, 1280);
    assert.deepEqual(errors, []);
    assert.deepEqual(requests, [url], 'no request but the page itself');
    assert.equal(drawn.length, 2);
    checkSide(drawn[0], run);
    checkSide(drawn[1], run.compare);
    assert.ok(!drawn[1].charts.some((c) => c.chart === 'shadow'), 'the enforced policy has no shadow rule');
    // Side by side: each row's two charts start at the same height.
    const rows = await page.$$eval('.row', (rows) =>
      rows.map((r) => [...r.querySelectorAll(':scope > .cell')].map((c) => c.getBoundingClientRect().top)),
    );
    assert.ok(rows.length >= 4 + run.rules.length, `${rows.length} rows`);
    for (const tops of rows) {
      assert.equal(tops.length, 2);
      assert.equal(tops[0], tops[1]);
    }
    await page.screenshot({ path: path.join(OUT, 'compare.png'), fullPage: true });
    // The top of the page, as docs/report.png shows it in the README.
    await page.screenshot({ path: path.join(OUT, 'compare-top.png'), clip: { x: 0, y: 0, width: 1280, height: 1400 } });
    await page.close();
  });

  it('a name that looks like markup stays text', async () => {
    const scenario = path.join(OUT, 'markup-scenario.toml');
    fs.writeFileSync(
      scenario,
      'seed = 2\n[attributes]\nip = "10.0.0.{client}"\nagent = "<img src=x onerror=alert(1)>"\n' +
        '[[phases]]\nname = "<script>alert(2)</script>"\nduration = "2m"\nrate = 30\nclients = 2\n',
    );
    const file = path.join(OUT, 'markup.html');
    simulate(file, ['--scenario', scenario]);
    const { page, requests, url, errors } = await open(browser, file, 900);
    assert.deepEqual(errors, []);
    assert.deepEqual(requests, [url]);
    assert.equal(await page.$$eval('img, script', (e) => e.length), 0);
    const text = await page.$eval('.meta', (e) => e.textContent);
    assert.ok(text.includes('<script>alert(2)</script>'), text);
    assert.ok(text.includes('<img src=x onerror=alert(1)>'), text);
    await page.close();
  });
});
