import { defineSuite } from './suite';

defineSuite('valkey9');
