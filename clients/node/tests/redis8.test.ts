import { defineConfirm } from './confirm';
import { defineFencedWrites } from './fenced';
import { defineSentinel } from './sentinel';
import { defineSuite } from './suite';

defineSuite('redis8');
defineFencedWrites('redis8');
defineSentinel('redis8');
defineConfirm('redis8');
