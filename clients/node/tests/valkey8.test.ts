import { defineFencedWrites } from './fenced';
import { defineSuite } from './suite';

defineSuite('valkey8');
defineFencedWrites('valkey8');
