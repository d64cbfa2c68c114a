export { registerRoutes, SYSTEMONE_PATHS, type RouteDeps } from "./routes.js";
export { sendError, toWireError, errorHandler, notFoundHandler, frameworkErrors, clientErrorHandler } from "./errors.js";
export { requestIdFor, isSaneRequestId, REQUEST_ID_HEADER, SDK_REQUEST_ID_HEADER } from "./request-id.js";
export { registerJsonBody, checkContentLength, RawJsonBody } from "./body.js";
