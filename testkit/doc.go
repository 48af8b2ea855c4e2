// Package testkit is the home of the repository's test rigs: the packages
// below it set up and break what idem's own tests need, and none of them is
// part of idem's API.
//
//   - testdb: a database of its own per test, found or started as make test
//     does (pgurl resolves its URL);
//   - faultproxy: a TCP proxy between a test and PostgreSQL that cuts,
//     delays or drops the wire at a chosen message;
//   - holdkeys: keys held in progress by another session, for tests of
//     what a second caller sees;
//   - lincheck: the histories and models of the linearizability check
//     (porcupine);
//   - kit: the scenarios shared by idemtest and idemhttptest;
//   - consumertest: the broker adapters' consumer storms.
//
// They are published packages rather than internal ones because the
// nested modules' tests (idemgrpc, idemotel, the broker adapters...) use
// them, and a module must not import another module's internal packages.
// They follow the repository's needs and make no compatibility promise.
package testkit
