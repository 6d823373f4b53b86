import { defineConfirm } from './confirm';
import { defineFencedWrites } from './fenced';
import { defineSentinel } from './sentinel';
import { defineSuite } from './suite';

defineSuite('redis7');
defineFencedWrites('redis7');
defineSentinel('redis7');
defineConfirm('redis7');
