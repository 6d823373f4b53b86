import { defineFencedWrites } from './fenced';
import { defineSuite } from './suite';

defineSuite('redis7');
defineFencedWrites('redis7');
