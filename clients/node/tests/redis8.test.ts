import { defineConfirm } from './confirm';
import { defineFencedWrites } from './fenced';
import { definePack } from './pack';
import { defineSentinel } from './sentinel';
import { defineSuite } from './suite';
import { defineTypes } from './types';

defineSuite('redis8');
defineFencedWrites('redis8');
defineSentinel('redis8');
defineConfirm('redis8');
defineTypes('redis8');
definePack('redis8');
