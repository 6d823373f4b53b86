import { defineSuite } from './suite';

defineSuite('redis8');
