import { defineFencedWrites } from './fenced';
import { defineSuite } from './suite';

defineSuite('valkey9');
defineFencedWrites('valkey9');
