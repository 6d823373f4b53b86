import { defineSuite } from './suite';

defineSuite('valkey8');
