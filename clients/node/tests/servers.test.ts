/**
 * Every test on each server of the matrix (tests/servers.txt), one server after another:
 * each server's tests sit in top-level suites named after it, which the by-server
 * reporter counts.
 */
import { defineConfirm } from './confirm';
import { defineFencedWrites } from './fenced';
import { FLAVORS } from './harness';
import { definePack } from './pack';
import { defineSentinel } from './sentinel';
import { defineSuite } from './suite';
import { defineTypes } from './types';

for (const flavor of Object.keys(FLAVORS)) {
  defineSuite(flavor);
  defineFencedWrites(flavor);
  defineSentinel(flavor);
  defineConfirm(flavor);
  defineTypes(flavor);
  definePack(flavor);
}
