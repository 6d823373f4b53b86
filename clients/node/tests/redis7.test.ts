import { defineSuite } from './suite';

defineSuite('redis7');
