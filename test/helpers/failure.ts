/** The rejection of `p`, which must reject (a request the server must refuse); throws when it resolves. */
export async function failure(p: Promise<unknown>): Promise<any> {
  try {
    await p;
  } catch (e) {
    return e;
  }
  throw new Error('expected the request to fail');
}
