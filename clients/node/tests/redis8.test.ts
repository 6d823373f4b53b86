import { defineFencedWrites } from './fenced';
import { defineSuite } from './suite';

defineSuite('redis8');
defineFencedWrites('redis8');
