import { defineConfirm } from './confirm';
import { defineFencedWrites } from './fenced';
import { definePack } from './pack';
import { defineSentinel } from './sentinel';
import { defineSuite } from './suite';
import { defineTypes } from './types';

defineSuite('redis7');
defineFencedWrites('redis7');
defineSentinel('redis7');
defineConfirm('redis7');
defineTypes('redis7');
definePack('redis7');
