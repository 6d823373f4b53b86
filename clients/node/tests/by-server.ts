/**
 * A node:test reporter that counts passed, failed and skipped tests per server flavor:
 * each flavor's tests sit in top-level suites named after it, and top-level suites run
 * one after another. Suites are not counted.
 */
interface Event {
  type: string;
  data: { name?: string; nesting?: number; skip?: unknown; details?: { type?: string } };
}

async function* byServer(source: AsyncIterable<Event>): AsyncGenerator<string> {
  const counts = new Map<string, { pass: number; fail: number; skip: number }>();
  let flavor = 'unknown';
  for await (const ev of source) {
    if (ev.type === 'test:start' && ev.data.nesting === 0) flavor = ev.data.name ?? 'unknown';
    if (ev.type !== 'test:pass' && ev.type !== 'test:fail') continue;
    if (ev.data.details?.type === 'suite') continue;
    let c = counts.get(flavor);
    if (!c) counts.set(flavor, (c = { pass: 0, fail: 0, skip: 0 }));
    if (ev.data.skip !== undefined && ev.data.skip !== false) c.skip++;
    else if (ev.type === 'test:pass') c.pass++;
    else c.fail++;
  }
  const total = { pass: 0, fail: 0, skip: 0 };
  for (const [flavor, c] of [...counts].sort()) {
    yield `${flavor}: ${c.pass} passed, ${c.fail} failed, ${c.skip} skipped\n`;
    total.pass += c.pass;
    total.fail += c.fail;
    total.skip += c.skip;
  }
  yield `node: ${total.pass} passed, ${total.fail} failed, ${total.skip} skipped\n`;
}

export = byServer;
