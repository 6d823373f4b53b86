import { defineConfirm } from './confirm';
import { defineFencedWrites } from './fenced';
import { definePack } from './pack';
import { defineSentinel } from './sentinel';
import { defineSuite } from './suite';
import { defineTypes } from './types';

defineSuite('valkey8');
defineFencedWrites('valkey8');
defineSentinel('valkey8');
defineConfirm('valkey8');
defineTypes('valkey8');
definePack('valkey8');
