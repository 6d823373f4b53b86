import { defineConfirm } from './confirm';
import { defineFencedWrites } from './fenced';
import { definePack } from './pack';
import { defineSentinel } from './sentinel';
import { defineSuite } from './suite';
import { defineTypes } from './types';

defineSuite('valkey9');
defineFencedWrites('valkey9');
defineSentinel('valkey9');
defineConfirm('valkey9');
defineTypes('valkey9');
definePack('valkey9');
